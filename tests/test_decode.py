"""decode.py: order kept across length-sorted batches, batch independence, entropy."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.errors import ConfigError
from seq2seq.inference.decode import attention_entropy, decode, length_sorted_batches
from seq2seq.model import build_model

VOCAB = 40


class _WordTok:
    """Word-level stand-in for SentencePiece: a word's id is a stable hash into the vocab."""

    def encode(self, text: str) -> list[int]:
        return [4 + sum(map(ord, w)) % (VOCAB - 4) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


class _Toks:
    src = _WordTok()
    tgt = _WordTok()


def _model(attention: str = "bahdanau") -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = {"emb_size": 16, "hidden_size": 16, "dropout": 0.0, "attention": {"name": attention}}
    return build_model(cfg, VOCAB, VOCAB).eval()


SOURCES = [
    "a b c d e f g h i j k",
    "uno",
    "dos tres",
    "",
    "x y z w v u t s r q p o n m l k j i h g f e d c b a",
    "el principio creo dios",
    "los cielos y la tierra",
]


def test_length_sorted_batches_cover_every_nonempty_source_longest_first() -> None:
    lengths = [3, 0, 10, 1, 5, 5]
    batches = length_sorted_batches(lengths, batch_tokens=10)
    flat = [int(i) for b in batches for i in b]
    assert sorted(flat) == [0, 2, 3, 4, 5]  # the empty source is left out
    assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)
    for b in batches:  # padded size within budget unless a single sentence exceeds it
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 10
    with pytest.raises(ConfigError, match="batch_tokens"):
        length_sorted_batches(lengths, 0)


@pytest.mark.parametrize("beam", [1, 3])
def test_order_is_kept_and_batches_do_not_change_outputs(beam: int) -> None:
    model = _model()
    batched = decode(model, _Toks(), SOURCES, beam=beam, batch_tokens=30, max_len_ratio=1.0,
                     max_len_extra=3, progress=False)
    alone = [decode(model, _Toks(), [s], beam=beam, batch_tokens=1000, max_len_ratio=1.0,
                    max_len_extra=3, progress=False)
             for s in SOURCES]
    assert batched.hypotheses == [d.hypotheses[0] for d in alone]
    assert batched.lengths == [d.lengths[0] for d in alone]
    for got, want in zip(batched.entropies, alone, strict=True):
        assert got == pytest.approx(want.entropies[0], nan_ok=True, abs=1e-5)
    assert batched.hypotheses[3] == "" and math.isnan(batched.entropies[3])
    # the outputs differ between sentences: order really matters for this check
    assert len(set(batched.hypotheses)) > 2


def test_sorted_and_reversed_inputs_give_the_same_per_sentence_outputs() -> None:
    model = _model("luong")
    kw = {"beam": 2, "batch_tokens": 40, "max_len_ratio": 1.0, "max_len_extra": 3, "progress": False}
    forward = decode(model, _Toks(), SOURCES, **kw)
    backward = decode(model, _Toks(), SOURCES[::-1], **kw)
    assert backward.hypotheses[::-1] == forward.hypotheses
    assert forward.lengths == [len(h.split()) for h in forward.hypotheses]


def test_attention_entropy() -> None:
    uniform = torch.full((3, 4), 0.25)
    assert attention_entropy(uniform) == pytest.approx(math.log(4))
    peaked = torch.tensor([[1.0, 0.0, 0.0]])
    assert attention_entropy(peaked) == pytest.approx(0.0)
    assert math.isnan(attention_entropy(torch.zeros(2, 5)))  # `none`: no distribution
    assert math.isnan(attention_entropy(torch.zeros(0, 5)))  # empty output


def test_none_attention_has_no_entropy_but_decodes() -> None:
    out = decode(_model("none"), _Toks(), SOURCES[:3], beam=2, progress=False)
    assert all(math.isnan(e) for e in out.entropies)
    assert all(isinstance(h, str) for h in out.hypotheses)


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="beam"):
        decode(_model(), _Toks(), SOURCES, beam=0)
    with pytest.raises(ConfigError, match="max_len_ratio"):
        decode(_model(), _Toks(), SOURCES, max_len_ratio=0)


def test_the_progress_bar_goes_to_terminals_only(capsys, monkeypatch) -> None:
    import sys

    decode(_model(), _Toks(), SOURCES, beam=2, progress=True)
    assert capsys.readouterr().err == ""  # stderr is captured, not a terminal: no bar

    class Terminal:
        written: list[str] = []

        def write(self, text: str) -> int:
            self.written.append(text)
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    decode(_model(), _Toks(), SOURCES, beam=2, progress=True)
    assert any("decode beam=2" in text for text in Terminal.written)
