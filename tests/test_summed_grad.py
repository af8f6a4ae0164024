"""The additive keys' gradient summed into one buffer over a teacher-forced loop
(deferred.SummedGrad with the C score kernels) against autograd's sum of per-step
gradients: one scorer over a loop with shrinking rows, and a whole training step."""

from __future__ import annotations

import pytest
import torch
from model_helpers import one_thread  # noqa: F401  (autouse fixture)

from seq2seq import native
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.model import build_model, scorers
from seq2seq.model.deferred import SummedGrad

needs_kernels = pytest.mark.skipif(not native.available(),
                                   reason=f"native kernels not built here: {native.status()}")
ROWS = [5, 5, 4, 2, 1]  # the packed loop's rows per step


def _scorer_loop(scorer, queries, keys, summed: bool):
    """Σ_t scores_t · u_t over a loop whose step t reads the first ROWS[t] rows."""
    grad = SummedGrad(keys) if summed else None
    shared = grad.shared if summed else keys
    total = 0
    for t, rows in enumerate(ROWS):
        scores = scorer(queries[:rows, t], shared[:rows], grad)
        weights = torch.linspace(-1, 1, scores.numel()).view_as(scores) * (t + 1)
        total = total + (scores * weights).sum()
    return total


@needs_kernels
@pytest.mark.parametrize("kernels", [True, False])
def test_summed_keys_gradient_equals_autograds(monkeypatch, kernels):
    """Through the kernels the steps add into the buffer; on the torch path the scorer
    falls back to the attached keys. Both give autograd's gradients of keys, queries and v."""
    torch.manual_seed(0)
    scorer = scorers.AdditiveScorer(6, 8, 8)
    queries = torch.randn(5, len(ROWS), 6, requires_grad=True)
    keys = torch.randn(5, 7, 8, requires_grad=True)
    monkeypatch.setattr(native, "_chosen",
                        {"additive_scores with gradients on 1 thread": (kernels, "a timing")})
    calls = []
    kernel = native.additive_scores_backward
    monkeypatch.setattr(native, "additive_scores_backward",
                        lambda *a: calls.append(a[-1]) or kernel(*a))
    inputs = (queries, keys, scorer.query_proj.weight, scorer.v.weight)
    got = torch.autograd.grad(_scorer_loop(scorer, queries, keys, True), inputs)
    assert len(calls) == (len(ROWS) if kernels else 0)
    assert all(buffer is not None for buffer in calls)
    with native.disabled():
        want = torch.autograd.grad(_scorer_loop(scorer, queries, keys, False), inputs)
    for g, w in zip(got, want, strict=True):
        assert g is not None and g.abs().max() > 0
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _bahdanau_step_grads(monkeypatch, summed: bool):
    torch.manual_seed(0)
    cfg = ModelConfig(emb_size=8, hidden_size=6, attention=AttentionConfig(name="bahdanau"))
    model = build_model(cfg, 15, 15)
    gen = torch.Generator().manual_seed(1)
    src_lens = torch.tensor([7, 3, 5, 1])
    src = torch.randint(4, 15, (4, 7), generator=gen)
    src[torch.arange(7).unsqueeze(0) >= src_lens.unsqueeze(1)] = PAD_ID
    tgt = torch.randint(4, 15, (4, 6), generator=gen)
    tgt_lens = torch.tensor([6, 2, 4, 3])  # different lengths: rows leave the loop
    tgt[torch.arange(6).unsqueeze(0) >= tgt_lens.unsqueeze(1)] = PAD_ID
    tgt_in = torch.cat([torch.full((4, 1), BOS_ID), tgt[:, :-1]], 1)
    targets = tgt.clone()
    targets[torch.arange(4), tgt_lens - 1] = EOS_ID
    monkeypatch.setattr(scorers.AdditiveScorer, "sums_key_grads",
                        lambda self, keys, summed=summed: summed)
    torch.manual_seed(2)  # the same dropout masks in both runs
    loss = model(src, src_lens, tgt_in, targets=targets)
    return torch.autograd.grad(loss, list(model.parameters()))


@needs_kernels
def test_a_bahdanau_training_step_has_the_same_gradients_with_the_summed_keys(monkeypatch):
    monkeypatch.setattr(native, "_chosen",
                        {"additive_scores with gradients on 1 thread": (True, "a timing")})
    got = _bahdanau_step_grads(monkeypatch, True)
    want = _bahdanau_step_grads(monkeypatch, False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_keys_get_a_summed_gradient_only_with_grad_mode_on_the_cpu_in_fp32(monkeypatch):
    monkeypatch.setattr(native, "choose", lambda name, trial, margin=1.0: True)
    scorer = scorers.AdditiveScorer(6, 8, 8)
    keys = torch.randn(2, 3, 8, requires_grad=True)
    assert scorer.sums_key_grads(keys)
    assert not scorer.sums_key_grads(keys.detach())
    assert not scorer.sums_key_grads(keys.double())
    with torch.no_grad():
        assert not scorer.sums_key_grads(keys)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not scorer.sums_key_grads(keys)
    monkeypatch.setattr(native, "choose", lambda name, trial, margin=1.0: False)
    assert not scorer.sums_key_grads(keys)
