"""The Translator API, the line filter, and the `seq2seq-translate` error cases."""

from __future__ import annotations

import copy
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_translate import (
    PAIRS,
    trained_run,
    trained_word_translator,
    word_translator,
)
from omegaconf import DictConfig, OmegaConf

from seq2seq.config import TranslateConfig, validate_translate
from seq2seq.constants import EOS_ID
from seq2seq.corpus import batching
from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.inference.command import run_filter, translator_from_config
from seq2seq.inference.translator import Translator, decode_line, repair_text


@pytest.fixture(scope="module")
def translator() -> Translator:
    return trained_word_translator()


# ---------------------------------------------------------------- the API


def test_translate_returns_text_tokens_score_and_attention(translator: Translator) -> None:
    [r] = translator.translate(["creó dios los cielos y la tierra"], beam=5)
    assert r.text == "god created the heaven and the earth"
    assert r.src_tokens == ["▁creó", "▁dios", "▁los", "▁cielos", "▁y", "▁la", "▁tierra"]
    assert r.tgt_tokens == ["▁god", "▁created", "▁the", "▁heaven", "▁and", "▁the", "▁earth"]
    assert r.attention.shape == (len(r.tgt_tokens), len(r.src_tokens))
    assert r.attention.dtype == np.float32
    np.testing.assert_allclose(r.attention.sum(axis=1), 1.0, atol=1e-5)  # one distribution per output
    assert r.score < 0 and not r.truncated and r.alternatives == []


def test_results_come_back_in_order_and_do_not_depend_on_the_batch(translator: Translator) -> None:
    sources = [s for s, _ in PAIRS] + ["", "   ", "la tierra y dios"]
    together = translator.translate(sources, beam=3, batch_tokens=8)
    alone = [translator.translate([s], beam=3)[0] for s in sources]
    assert [r.source for r in together] == sources
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.text for r in together[:5]] == [t for _, t in PAIRS[:5]]  # memorised
    for a, b in zip(together, alone, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-5)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-5)


def test_empty_and_blank_lines_give_empty_translations(translator: Translator) -> None:
    for r in translator.translate(["", "  \t "], beam=5):
        assert (r.text, r.src_tokens, r.tgt_tokens, r.attention.shape) == ("", [], [], (0, 0))


def test_beam_one_is_greedy_and_nbest_gives_sorted_alternatives(translator: Translator) -> None:
    [greedy] = translator.translate(["los cielos"], beam=1)
    assert greedy.text == "the heaven"
    [r] = translator.translate(["los cielos"], beam=4, nbest=3)
    assert len(r.alternatives) == 2
    scores = [r.score] + [a.score for a in r.alternatives]
    assert scores == sorted(scores, reverse=True)
    assert len({r.text, *(a.text for a in r.alternatives)}) == 3  # three different outputs
    for alt in r.alternatives:
        assert alt.attention.shape == (len(alt.tgt_tokens), 2)


def test_bad_requests_are_config_errors(translator: Translator) -> None:
    with pytest.raises(ConfigError, match="nbest must be between 1 and the beam size"):
        translator.translate(["dios"], beam=2, nbest=3)
    for beam in (0, 65, 10**20):
        with pytest.raises(ConfigError, match=r"beam size must be between 1 \(greedy\) and 64"):
            translator.translate(["dios"], beam=beam)
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate("dios")  # type: ignore[arg-type]


def test_long_input_is_truncated_to_the_maximum() -> None:
    t = word_translator(max_src_tokens=3)
    [r] = t.translate(["creó dios los cielos y la tierra"], beam=2)
    assert r.truncated and r.src_tokens == ["▁creó", "▁dios", "▁los"]
    assert r.attention.shape[1] == 3
    [short] = t.translate(["la tierra"], beam=2)
    assert not short.truncated


def test_unseen_characters_and_broken_text_do_not_crash(translator: Translator) -> None:
    [r] = translator.translate(["dios ☃ 𝄞 ñandú \udc80 日本"], beam=3)
    assert r.src_tokens[-2] == "▁\ufffd"  # the lone surrogate became U+FFFD, then UNK
    assert r.attention.shape == (len(r.tgt_tokens), 6)


def test_no_attention_model_gives_zero_weights() -> None:
    [r] = word_translator("none").translate(["la tierra"], beam=1)
    assert r.attention.shape == (len(r.tgt_tokens), 2) and not r.attention.any()


def test_source_is_encoded_exactly_as_training_encodes_it(translator: Translator) -> None:
    sentences = ["en el principio", "la tierra y los cielos", "dios"]
    pairs = [{"es": s, "en": ""} for s in sentences]
    enc = batching.encode_pairs(pairs, translator.tokenizers, "es", "en")
    for i, s in enumerate(sentences):
        ids, _, _ = translator.encode(s)
        assert ids == enc.src(i).tolist()  # no BOS/EOS added on either side


# ---------------------------------------------------------------- text repair


def test_decode_line_replaces_invalid_utf8() -> None:
    assert decode_line("año\n".encode()) == ("año", False)
    assert decode_line(b"a\xffb\r\n") == ("a\ufffdb", True)
    assert decode_line(b"") == ("", False)


def test_repair_text() -> None:
    assert repair_text("año") == ("año", False)
    assert repair_text("a\udcffb") == ("a\ufffdb", True)  # surrogate-escaped byte 0xff
    assert repair_text("a\ud800b")[1]  # a lone high surrogate: replaced too
    repaired, _ = repair_text("a\ud800b")
    repaired.encode("utf-8")


# ---------------------------------------------------------------- the filter, in process


def test_filter_writes_one_line_per_input_line_in_order(translator: Translator) -> None:
    lines = b"los cielos\n\nla tierra\n\xff\xfe dios\ndios\r\nen el principio"  # no final newline
    out, err = io.StringIO(), io.StringIO()
    n = run_filter(translator, io.BytesIO(lines), out, err, beam=3)
    assert n == 6
    assert out.getvalue().split("\n") == ["the heaven", "", "the earth", "god", "god",
                                          "in the beginning", ""]
    assert err.getvalue() == "warning: line 4: invalid UTF-8 replaced by U+FFFD\n"


def test_filter_warns_about_truncation_on_stderr_only() -> None:
    t = word_translator(max_src_tokens=2)
    out, err = io.StringIO(), io.StringIO()
    run_filter(t, io.BytesIO(b"la tierra\ncreo dios los cielos\n"), out, err, beam=2)
    assert len(out.getvalue().splitlines()) == 2
    assert err.getvalue().count("\n") == 1
    assert "line 2: input cut to the model's maximum of 2 subwords" in err.getvalue()


# ---------------------------------------------------------------- configuration errors


def _cfg(**overrides: object) -> DictConfig:
    cfg = OmegaConf.structured(TranslateConfig)
    cfg.run = "/nonexistent/run"
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def test_alignment_outside_its_choices_is_refused() -> None:
    from omegaconf.errors import ValidationError

    with pytest.raises(ValidationError, match=r"Invalid value 'fuzzy', expected one of \[soft, hard\]"):
        _cfg(alignment="fuzzy")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"run": None}, "no model given: pass run=<run folder or checkpoint>"),
    ({"beam": 2, "nbest": 3}, "nbest=3 with beam=2: nbest must be between 1 and the beam size"),
    ({"beam": 0}, "beam=0: the beam size must be between 1 (greedy) and 64"),
    ({"max_src_tokens": -1}, "max_src_tokens=-1 must be >= 0"),
    ({"device": "tpu"}, "device='tpu': use auto, cpu or cuda"),
    ({"beam": 65}, "beam=65: the beam size must be between 1 (greedy) and 64"),
    ({"run": [""]}, "give a run folder, or a list of run folders"),
])
def test_bad_settings_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_translate(_cfg(**overrides))


def test_missing_or_corrupt_runs_are_checkpoint_errors(tmp_path: Path) -> None:
    validate_translate(_cfg())
    with pytest.raises(CheckpointError, match="does not exist"):
        translator_from_config(_cfg())
    with pytest.raises(CheckpointError, match="holds no best.pt or last.pt"):
        Translator.from_run(tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            Translator.from_run(tmp_path, device="cuda")
    (tmp_path / "best.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        Translator.from_run(tmp_path)


# ---------------------------------------------------------------- the command line, end to end

REPO = Path(__file__).resolve().parent.parent
CLI = "from seq2seq.cli import translate_main; translate_main()"


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`seq2seq-translate ARGS` with ``stdin`` piped in (so: the filter)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", CLI, *args], input=stdin, capture_output=True,
                          env=env, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tiny_train_overrides: list[str]) -> Path:
    return trained_run(tuple(tiny_train_overrides))


def test_filter_mode_end_to_end(run_dir: Path) -> None:
    lines = ["el perro rojo ve la casa", "", "la niña bebe el agua", "el gato come pan hoy"]
    raw = "\n".join(lines[:2]).encode() + b"\n\xffla ni\xc3a bebe\n" + "\n".join(lines[2:]).encode()
    proc = cli(f"run={run_dir}", "beam=3", stdin=raw)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().split("\n")
    expected = Translator.from_run(run_dir).translate(
        [lines[0], "", "\ufffdla ni\ufffda bebe", *lines[2:]], beam=3)
    assert out == [r.text for r in expected] + [""]  # one line per input line, in order
    assert all(out[i] for i in (0, 2, 3, 4)) and out[1] == ""
    assert proc.stderr.decode() == "warning: line 3: invalid UTF-8 replaced by U+FFFD\n"
    assert not list(REPO.glob("translate*.log"))  # no log file, nothing but translations


def _one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_missing_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _one_line_error(cli(f"run={tmp_path}/nope", stdin=b"hola\n"), "does not exist")
    _one_line_error(cli(stdin=b"hola\n"), "no model given: pass run=")
    _one_line_error(cli(f"run={tmp_path}", "beam=2", "nbest=3"), "nbest=3 with beam=2: nbest must be between")


def test_corrupt_checkpoint_is_one_line_and_exit_2(run_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    data = (broken / "best.pt").read_bytes()
    (broken / "best.pt").write_bytes(data[: len(data) // 2])
    _one_line_error(cli(f"run={broken}", stdin=b"hola\n"), "is corrupt or truncated")
    shutil.rmtree(broken / "tokenizer")
    with pytest.raises(CheckpointError, match="tokenizer/ folder"):
        Translator.from_run(broken / "last.pt")


def test_corrupt_or_foreign_tokenizer_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "tokenizer" / "spm_src.model").write_bytes(b"not a sentencepiece model")
    _one_line_error(cli(f"run={broken}", stdin=b"hola\n"), "is missing or not a SentencePiece model")
    # a valid model, but not the one the checkpoint was trained with
    shutil.rmtree(broken)
    shutil.copytree(run_dir, broken)
    tok = broken / "tokenizer"
    (tok / "spm_src.model").write_bytes((tok / "spm_tgt.model").read_bytes())
    _one_line_error(cli(f"run={broken}", stdin=b"hola\n"), "is not the tokenizer best.pt was trained with")


def test_os_errors_become_one_line_with_the_fix() -> None:
    import errno

    from seq2seq.cli import os_error_message

    full = os_error_message(OSError(errno.ENOSPC, "No space left on device", "runs/x/last.pt"))
    assert full.startswith("No space left on device (runs/x/last.pt): free disk space")
    denied = os_error_message(OSError(errno.EACCES, "Permission denied", "/root/out.en"))
    assert "choose a folder you may write to" in denied


def test_auto_threads_are_one_for_a_pipe_and_all_cores_for_a_file(monkeypatch, tmp_path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    from types import SimpleNamespace

    loaded = SimpleNamespace(model=None, device=torch.device("cpu"), bf16=None)
    monkeypatch.setattr(Translator, "from_run", classmethod(lambda cls, *a, **k: loaded))
    # fp32 and one worker: no probe of the stand-in model
    cfg = _cfg(run=str(tmp_path), precision="fp32", workers=1)
    assert cfg.threads == -1  # the default: auto
    assert translator_from_config(cfg) is loaded and calls == [1] and loaded.bf16 is False
    translator_from_config(cfg, batched=True)
    assert calls == [1]  # file mode leaves torch's default: all cores
    cfg.threads = 3
    translator_from_config(cfg, batched=True)
    assert calls == [1, 3]
    with pytest.raises(ConfigError, match="threads=-2 must be >= -1"):
        validate_translate(_cfg(threads=-2))
    with pytest.raises(ConfigError, match="workers=0 must be -1"):
        validate_translate(_cfg(workers=0))


def test_bf16_decoding_runs_the_model_in_bf16_and_keeps_the_translations() -> None:
    """Translator.bf16: the decoder's matmuls run under bf16 autocast (where the CPU has
    native bf16) and the trained toy model still writes the same translations."""
    from seq2seq import runtime

    t = trained_word_translator()
    sentences = ["en el principio creó dios los cielos y la tierra", "dios creó la tierra"]
    fp32 = t.translate(sentences, beam=3, nbest=2)
    seen: list[torch.dtype] = []
    step = t.model.step

    def recording_step(*args):  # the dtype of the logits the search reads
        logits, state, weights = step(*args)
        seen.append(logits.dtype)
        return logits, state, weights

    t.model.step = recording_step
    try:
        t.bf16 = True
        bf16 = t.translate(sentences, beam=3, nbest=2)
    finally:
        t.bf16 = False
        del t.model.step
    native = runtime.bf16_supported(torch.device("cpu"))
    assert set(seen) == ({torch.bfloat16} if native else {torch.float32})
    assert [r.text for r in bf16] == [r.text for r in fp32]
    assert [r.score for r in bf16] == pytest.approx([r.score for r in fp32], abs=0.05)
    assert t.translate(sentences, beam=3)[0].text == fp32[0].text  # back in fp32


def test_precision_auto_times_the_decoder_at_the_mode_batch_size(monkeypatch, tmp_path) -> None:
    from seq2seq import precision, runtime
    from seq2seq.inference import command

    t = trained_word_translator()
    timed: list[float] = []
    real_probe = precision.probe_rounds

    def probe(step, device, modes, sizes=None):  # the real step runs; the times are ours
        assert modes == ("fp32", "bf16")  # decoding has no loss to put in bf16
        real_probe(step, device, modes, sizes)
        timed.append(1.0)
        return {"fp32": [0.02], "bf16": [0.01]} if fast_bf16 else {"fp32": [0.01], "bf16": [0.02]}

    monkeypatch.setattr(precision, "probe_rounds", probe)
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    cfg = _cfg(run=str(tmp_path), beam=3, batch_tokens=300)
    for fast_bf16 in (True, False):
        choice = command.choose_precision(cfg, t, batched=True)
        assert choice.bf16 is fast_bf16
        assert "a decoding batch of 10 x beam 3" in choice.reason  # 300 tokens / 30 per sentence
    assert "a decoding batch of 1 x beam 3" in command.choose_precision(cfg, t, batched=False).reason
    cfg.precision = "fp32"
    assert command.choose_precision(cfg, t, batched=True).bf16 is False and len(timed) == 3


@pytest.mark.parametrize("name", ["step_probe", "search_probe"])
def test_the_decoding_probes_leave_the_model_as_it_was(name: str) -> None:
    from seq2seq.inference import probe

    t = trained_word_translator()
    t.model.train()
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    getattr(probe, name)(t.model, sentences=4, beam=2, src_len=7)()
    assert t.model.training
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())
    t.model.eval()


@pytest.mark.parametrize("beam", [1, 3])
def test_the_search_probe_runs_the_real_search_capped_at_its_steps(
        beam: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from seq2seq.inference import probe

    model = copy.deepcopy(trained_word_translator().model)
    dec = model.decoder
    with torch.no_grad():  # EOS never wins, so every output runs to the cap
        (dec.out_bias if dec.tie_embeddings else dec.output.bias)[EOS_ID] = -1e9
    seen = []
    real = probe.search_batch

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((tuple(args[1].shape), [len(h.tokens) for hs in out for h in hs]))
        return out

    monkeypatch.setattr(probe, "search_batch", spy)
    probe.search_probe(model, sentences=4, beam=beam, src_len=7, steps=3)()
    [(shape, lengths)] = seen
    assert shape == (4, 7) and lengths == [3, 3, 3, 3]
