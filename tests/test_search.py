"""Greedy and beam search: beam 1 == greedy, batch independence, ordering, EOS, n-best."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from model_helpers import (
    fit,
    one_thread,  # noqa: F401  (autouse fixture)
    reverse_task,
)
from search_reference import reference_beam_search
from torch import nn

from seq2seq import native
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.search import Hypothesis, beam_search, greedy, length_penalty
from seq2seq.inference.vocab import row_topk
from seq2seq.model import build_model

VOCAB = 12




@pytest.fixture(scope="module")
def trained():
    """A Bahdanau model that has (over)fitted the reverse task: it emits EOS."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(emb_size=32, hidden_size=64, dropout=0.1,
                      attention=AttentionConfig(name="bahdanau"))
    model = build_model(cfg, VOCAB, VOCAB)
    src, lens, tgt_in, tgt_out = reverse_task(vocab=VOCAB)
    fit(model, src, lens, tgt_in, tgt_out, steps=80)
    return model.train(), src[:12], lens[:12]


def _untrained(name: str):
    torch.manual_seed(1)
    return build_model(ModelConfig(emb_size=16, hidden_size=16,
                                   attention=AttentionConfig(name=name)), VOCAB, VOCAB)


def _forced_log_prob(model, src, lens, tokens: list[int], with_eos: bool) -> float:
    """log P(tokens [+ EOS] | src) by teacher forcing one sentence."""
    target = tokens + ([EOS_ID] if with_eos else [])
    tgt_in = torch.tensor([[BOS_ID] + target[:-1]])
    with torch.no_grad():
        logp = torch.log_softmax(model.eval()(src, lens, tgt_in).float(), dim=-1)
    return float(logp[0, torch.arange(len(target)), torch.tensor(target)].sum())


def test_the_trained_model_reverses(trained):
    model, src, lens = trained
    for hyp, s, n in zip(greedy(model, src, lens), src, lens.tolist(), strict=True):
        assert hyp.tokens == s[:n].flip(0).tolist()
    for hyps, s, n in zip(beam_search(model, src, lens, beam=4), src, lens.tolist(), strict=True):
        assert hyps[0].tokens == s[:n].flip(0).tolist()


def test_search_restores_the_training_mode(trained):
    model, src, lens = trained
    assert model.training
    greedy(model, src[:2], lens[:2])
    beam_search(model, src[:2], lens[:2])
    assert model.training


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("name", ["trained", "none", "bahdanau", "luong"])
def test_beam_one_equals_greedy(trained, name, alpha):
    if name == "trained":
        model, src, lens = trained
    else:  # untrained models rarely stop: this exercises the length cap too
        model, src, lens = _untrained(name), trained[1], trained[2]
    for g, b in zip(greedy(model, src, lens, alpha=alpha),
                    beam_search(model, src, lens, beam=1, alpha=alpha), strict=True):
        assert g.tokens == b[0].tokens
        assert g.score == pytest.approx(b[0].score, abs=1e-5)
        torch.testing.assert_close(g.attention, b[0].attention)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_output_does_not_depend_on_batch(trained, search):
    model, src, lens = trained

    def run(s, n):
        if search == "greedy":
            return [(h.tokens, h.score) for h in greedy(model, s, n)]
        return [[(h.tokens, h.score) for h in hs] for hs in beam_search(model, s, n, beam=3,
                                                                         nbest=3)]

    full = run(src, lens)
    order = torch.tensor([5, 0, 11, 3])  # other companions, other batch size, another order
    subset = run(src[order], lens[order])
    wide = run(torch.cat([src[order], torch.full((4, 3), PAD_ID)], dim=1), lens[order])
    for got in (subset, wide):
        for i, j in enumerate(order.tolist()):
            _assert_same(got[i], full[j])
    alone = run(src[7:8, : int(lens[7])], lens[7:8])
    _assert_same(alone[0], full[7])


def _assert_same(a, b):
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
        return
    assert a[0] == b[0]
    assert a[1] == pytest.approx(b[1], abs=1e-4)


@pytest.mark.parametrize("beam,nbest", [(1, 1), (3, 2), (5, 1), (5, 5)])
@pytest.mark.parametrize("name", ["trained", "none", "bahdanau", "luong", "lstm"])
def test_beam_search_equals_the_plain_reference(trained, name, beam, nbest):
    """The per-step records traced back give what copying every history gives: the same
    tokens, scores and attention, with sentences retiring at different steps (EOS, the
    n-best rule, the length cap) and an empty output among them. Both on the torch path,
    which the reference shares (the native kernels against it: tests/test_native.py)."""
    if name == "trained":
        model, src, lens = trained
    elif name == "lstm":
        torch.manual_seed(2)
        model = build_model(ModelConfig(emb_size=16, hidden_size=16, rnn_type="lstm",
                                        attention=AttentionConfig(name="luong")), VOCAB, VOCAB)
        src, lens = trained[1], trained[2]
    else:
        model, src, lens = _untrained(name), trained[1], trained[2]
    for ratio, extra in ((2.0, 10), (0.3, 1), (0.0, 1)):
        with native.disabled():
            got = beam_search(model, src, lens, beam=beam, nbest=nbest, max_len_ratio=ratio,
                              max_len_extra=extra)
            want = reference_beam_search(model, src, lens, beam=beam, nbest=nbest,
                                         max_len_ratio=ratio, max_len_extra=extra)
        assert len(got) == len(want)
        for g_hyps, w_hyps in zip(got, want, strict=True):
            assert [h.tokens for h in g_hyps] == [h.tokens for h in w_hyps]
            assert [h.score for h in g_hyps] == [h.score for h in w_hyps]
            for g, w in zip(g_hyps, w_hyps, strict=True):
                assert g.attention.dtype == w.attention.dtype == torch.float32
                torch.testing.assert_close(g.attention, w.attention, rtol=0, atol=0)


def test_an_empty_output_has_an_empty_attention():
    """EOS as the first token: no tokens, attention (0, src_len), from both searches."""
    model = _Scripted()
    model.step = lambda y, st, mem: (torch.where(torch.arange(6) == EOS_ID, 0.0, -9.0)
                                     .expand(y.size(0), 6).clone(), _State(y), mem.width.clone())
    src, lens = torch.tensor([[7, 7, 7]]), torch.tensor([3])
    for search in (beam_search, reference_beam_search):
        [[hyp]] = search(model, src, lens, beam=2)
        assert hyp.tokens == [] and hyp.attention.shape == (0, 3)


def test_nbest_sorted_distinct_and_scored_correctly(trained):
    model, src, lens = trained
    results = beam_search(model, src[:6], lens[:6], beam=5, nbest=4, alpha=0.6)
    cap = [int(2.0 * n) + 10 for n in lens[:6].tolist()]
    for b, hyps in enumerate(results):
        assert len(hyps) == 4
        assert len({tuple(h.tokens) for h in hyps}) == 4  # distinct
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            assert EOS_ID not in h.tokens and BOS_ID not in h.tokens and PAD_ID not in h.tokens
            assert h.attention.shape == (len(h.tokens), int(lens[b]))
            ended = len(h.tokens) < cap[b]  # under the cap a hypothesis ends only with EOS
            length = len(h.tokens) + (1 if ended else 0)
            logp = _forced_log_prob(model, src[b:b + 1], lens[b:b + 1], h.tokens, ended)
            assert h.score == pytest.approx(logp / length_penalty(length, 0.6), abs=1e-4)
    model.train()


def test_length_cap(trained):
    _, src, lens = trained
    model = _untrained("bahdanau")
    for hyp, n in zip(greedy(model, src, lens, max_len_ratio=0.5, max_len_extra=1),
                      lens.tolist(), strict=True):
        assert len(hyp.tokens) <= int(0.5 * n) + 1
    for hyps, n in zip(beam_search(model, src, lens, beam=3, max_len_ratio=0.0,
                                   max_len_extra=2), lens.tolist(), strict=True):
        assert len(hyps) >= 1 and all(len(h.tokens) <= 2 for h in hyps)
        assert hyps[0].attention.shape[1] == n


def test_bad_beam_settings_are_refused():
    model = _untrained("bahdanau")
    src, lens = torch.tensor([[4, 5]]), torch.tensor([2])
    with pytest.raises(ConfigError, match="nbest"):
        beam_search(model, src, lens, beam=2, nbest=3)
    with pytest.raises(ConfigError, match="beam"):
        beam_search(model, src, lens, beam=0)


# A scripted model: search must work through encode / init_state / step alone.
A, B = 4, 5


@dataclass
class _Memory:
    width: torch.Tensor  # (batch, S) zeros, only to size the attention

    def index_select(self, index):
        return _Memory(self.width.index_select(0, index))

    def repeat_rows(self, k):
        return _Memory(self.width.repeat_interleave(k, dim=0))


@dataclass
class _State:
    last: torch.Tensor  # (batch,) previous token

    def index_select(self, index):
        return _State(self.last.index_select(0, index))


class _Scripted(nn.Module):
    """P(A|BOS)=.6, P(B|BOS)=.4; after A: A .35, B .33, EOS .32; after B: EOS .9, A .1.

    Greedy follows A forever; the best complete output is [B] (p = .36).
    """

    def encode(self, src, src_lens):
        return _Memory(torch.zeros(src.shape))

    def init_state(self, memory):
        return _State(torch.full((memory.width.size(0),), BOS_ID))

    def step(self, y_prev, state, memory):
        table = torch.full((6, 6), 1e-9)
        table[BOS_ID, A], table[BOS_ID, B] = 0.6, 0.4
        table[A, A], table[A, B], table[A, EOS_ID] = 0.35, 0.33, 0.32
        table[B, EOS_ID], table[B, A] = 0.9, 0.1
        return table[y_prev].log(), _State(y_prev), memory.width.clone()


def test_beam_finds_what_greedy_misses_and_eos_ends_it():
    model = _Scripted()
    src, lens = torch.tensor([[7, 7, 7]]), torch.tensor([3])
    g = greedy(model, src, lens, max_len_ratio=1.0, max_len_extra=2)[0]
    assert g.tokens == [A] * 5  # capped at 1.0 * 3 + 2 tokens, no EOS
    best = beam_search(model, src, lens, beam=2, alpha=0.0, max_len_ratio=1.0,
                       max_len_extra=2, nbest=2)[0]
    assert best[0].tokens == [B]
    assert best[0].score == pytest.approx(math.log(0.4 * 0.9), abs=1e-5)
    # [A] + EOS (p = .192) fell outside the beam at step 2; [A, B] + EOS came next
    assert best[1].tokens == [A, B]
    assert best[1].score == pytest.approx(math.log(0.6 * 0.33 * 0.9), abs=1e-5)
    assert isinstance(best[0], Hypothesis) and best[0].attention.shape == (1, 3)


def test_length_penalty_prefers_longer_outputs_as_alpha_grows():
    assert length_penalty(3, 0.0) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    model = _Scripted()
    src, lens = torch.tensor([[7, 7, 7]]), torch.tensor([3])
    short = beam_search(model, src, lens, beam=3, alpha=0.0, nbest=3)[0]
    longer = beam_search(model, src, lens, beam=3, alpha=5.0, nbest=3)[0]
    assert len(longer[0].tokens) >= len(short[0].tokens)


@pytest.mark.parametrize("width", [8000, 8000 + 37, 100])
def test_row_topk_equals_torch_topk(width):
    """The two-stage top-k gives torch.topk's values, and its indices where values differ;
    with ties and -inf (PAD, BOS) its indices still point at those values."""
    gen = torch.Generator().manual_seed(width)
    x = torch.log_softmax(torch.randn(40, width, generator=gen) * 3, dim=1)
    x[:, :2] = float("-inf")
    x[:5, width - 3:] = 10.0  # the best entries in the last, partial block
    for k in (1, 5, 10):
        values, idx = row_topk(x, k)
        want_values, want_idx = x.topk(k, dim=1)
        assert torch.equal(values, want_values)
        assert torch.equal(x.gather(1, idx), values)
        distinct = (values[:, 1:] != values[:, :-1]).all(dim=1)
        assert torch.equal(idx[distinct], want_idx[distinct])
    ties = torch.randint(0, 4, (30, width), generator=gen).float()  # many equal values
    values, idx = row_topk(ties, 10)
    assert torch.equal(values, ties.topk(10, dim=1).values)
    assert torch.equal(ties.gather(1, idx), values)
    assert bool((idx.sort(dim=1).values.diff(dim=1) > 0).all())  # no entry twice


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_probs_equal_the_plain_log_softmax(dtype):
    """vocab._log_probs (in place over an fp32 buffer) against log_softmax with PAD and
    BOS masked; bf16 logits are left as they were."""
    from seq2seq.inference.vocab import _log_probs

    logits = (torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    before = logits.clone()
    want = torch.log_softmax(logits.float(), dim=-1)
    want[:, [PAD_ID, BOS_ID]] = float("-inf")
    got = _log_probs(logits)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    if dtype == torch.bfloat16:
        assert torch.equal(logits, before)
    else:  # written over the step's own fp32 output: no second (N, V) buffer
        assert got.data_ptr() == logits.data_ptr()
