"""Attention modules: shapes, masking, batched == per-step, gradients, the registry."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ATTENTION_VARIANTS as VARIANTS
from model_helpers import one_thread  # noqa: F401  (autouse fixture)
from model_helpers import variant_id as _ids

from seq2seq.config import AttentionConfig
from seq2seq.errors import ConfigError
from seq2seq.model.attention import (
    ATTENTIONS,
    LUONG_SCORES,
    Attention,
    AttentionMemory,
    build_attention,
)

ENC, DEC = 10, 6  # a bidirectional encoder (2 x 5) feeding a smaller decoder



def _inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 2, 4])
    h = torch.randn(3, 5, ENC, generator=gen, dtype=dtype)
    mask = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)
    h = h * mask.unsqueeze(-1)  # the encoder gives zeros at padding
    return h, mask


@pytest.mark.parametrize("cfg", VARIANTS, ids=_ids)
def test_shapes_masking_and_normalisation(cfg):
    torch.manual_seed(0)
    att = build_attention(cfg, ENC, DEC)
    h, mask = _inputs()
    memory = att.init(h, mask)
    assert isinstance(memory, AttentionMemory)
    context, weights = att(torch.randn(3, DEC), memory)
    assert context.shape == (3, att.context_size) and weights.shape == (3, 5)
    ctx_t, w_t = att(torch.randn(3, 7, DEC), memory)  # all steps at once
    assert ctx_t.shape == (3, 7, att.context_size) and w_t.shape == (3, 7, 5)
    for w in (weights, w_t):
        padding = (~mask).view(3, *([1] * (w.dim() - 2)), 5).expand_as(w)
        at_padding = w[padding]
        # exactly zero, not merely small, at padded source positions
        assert at_padding.numel() > 0 and bool((at_padding == 0).all())
        expected = 0.0 if cfg.name == "none" else 1.0
        torch.testing.assert_close(w.sum(-1), torch.full(w.shape[:-1], expected))


@pytest.mark.parametrize("cfg", VARIANTS, ids=_ids)
def test_batched_query_equals_per_step(cfg):
    """The fused decoder path asks for all steps at once; it must match step by step."""
    torch.manual_seed(0)
    att = build_attention(cfg, ENC, DEC)
    h, mask = _inputs()
    memory = att.init(h, mask)
    queries = torch.randn(3, 4, DEC)
    ctx_all, w_all = att(queries, memory)
    for t in range(4):
        ctx, w = att(queries[:, t], memory)
        torch.testing.assert_close(ctx_all[:, t], ctx)
        torch.testing.assert_close(w_all[:, t], w)


@pytest.mark.parametrize("cfg", VARIANTS, ids=_ids)
def test_grouped_memory_equals_a_copy_per_row(cfg):
    """Beam search's memory shared by each sentence's hypotheses (repeat_rows) gives what
    a copy of the memory per hypothesis gives, and keeps whole groups when reordered."""
    torch.manual_seed(0)
    att = build_attention(cfg, ENC, DEC).double()
    h, mask = _inputs(torch.float64)
    memory = att.init(h, mask)
    k = 4
    copied = memory.index_select(torch.arange(3).repeat_interleave(k))
    grouped = memory.repeat_rows(k)
    assert grouped.values.size(0) == 3 and grouped.group == k  # nothing copied
    query = torch.randn(3 * k, DEC, dtype=torch.float64)
    for got, want in zip(att(query, grouped), att(query, copied), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # drop sentence 1: rows 4..7 of the 12
    rows = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    for got, want in zip(att(query[rows], grouped.index_select(rows)),
                         att(query[rows], copied.index_select(rows)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="whole groups"):
        grouped.index_select(torch.tensor([1, 2, 3, 4]))


def test_padding_does_not_change_weights():
    torch.manual_seed(0)
    att = build_attention(AttentionConfig(name="bahdanau"), ENC, DEC)
    h, mask = _inputs()
    q = torch.randn(3, DEC)
    _, w = att(q, att.init(h, mask))
    # the second sentence alone, without padding: same weights on its two tokens
    _, w_alone = att(q[1:2], att.init(h[1:2, :2], mask[1:2, :2]))
    torch.testing.assert_close(w[1, :2], w_alone[0])


@pytest.mark.parametrize("cfg", VARIANTS, ids=_ids)
def test_gradcheck_float64(cfg):
    torch.manual_seed(0)
    att = build_attention(cfg, ENC, DEC).double()
    h, mask = _inputs(torch.float64)
    h.requires_grad_(True)
    query = torch.randn(3, DEC, dtype=torch.float64, requires_grad=True)

    def fn(q, states):
        return att(q, att.init(states, mask))

    assert torch.autograd.gradcheck(fn, (query, h), eps=1e-6, atol=1e-5)


def test_none_context_is_fixed_and_reads_both_directions():
    torch.manual_seed(0)
    att = build_attention(AttentionConfig(name="none"), ENC, DEC)
    h, mask = _inputs()
    memory = att.init(h, mask)
    c1, _ = att(torch.randn(3, DEC), memory)
    c2, _ = att(torch.randn(3, DEC), memory)
    assert torch.equal(c1, c2)  # no dependence on the query
    # sentence 1 has length 2: c = tanh(W [fwd h_2 ; bwd h_1])
    half = ENC // 2
    summary = torch.cat([h[1, 1, :half], h[1, 0, half:]])
    torch.testing.assert_close(c1[1], torch.tanh(att.proj(summary)))


def test_flags_tell_the_decoder_what_it_needs():
    none = build_attention(AttentionConfig(name="none"), ENC, DEC)
    bahdanau = build_attention(AttentionConfig(name="bahdanau"), ENC, DEC)
    luong = build_attention(AttentionConfig(name="luong"), ENC, DEC)
    luong_nf = build_attention(AttentionConfig(name="luong", input_feeding=False), ENC, DEC)
    assert none.query_free and none.query_before_rnn and not none.feeds_input
    assert bahdanau.query_before_rnn and not bahdanau.query_free
    assert bahdanau.output_reads_embedding
    assert not luong.query_before_rnn and luong.feeds_input and not luong_nf.feeds_input
    assert all(isinstance(a, Attention) for a in (none, bahdanau, luong))


def test_attn_size_sets_the_additive_scorer_width():
    att = build_attention(AttentionConfig(name="bahdanau", attn_size=13), ENC, DEC)
    assert att.scorer.v.in_features == 13
    default = build_attention(AttentionConfig(name="bahdanau"), ENC, DEC)
    assert default.scorer.v.in_features == DEC


@pytest.mark.parametrize("steps", [None, 4], ids=["one_step", "all_steps"])
def test_additive_scores_are_v_tanh_and_so_are_their_gradients(steps):
    """The scorer computes vᵀ tanh(W q + U h_j) through the sigmoid; same values and grads."""
    torch.manual_seed(0)
    scorer = build_attention(AttentionConfig(name="bahdanau", attn_size=7), ENC, DEC).scorer
    scorer.double()
    with torch.no_grad():
        scorer.v.weight.add_(0.5)  # a v whose sum is far from 0, so the -Σv term matters
    h, _ = _inputs(torch.float64)
    query = torch.randn(3, DEC, dtype=torch.float64) if steps is None else \
        torch.randn(3, steps, DEC, dtype=torch.float64)
    keys = scorer.keys(h)
    q = scorer.query_proj(query)
    z = keys + q.unsqueeze(1) if steps is None else keys.unsqueeze(1) + q.unsqueeze(2)
    plain = (torch.tanh(z) @ scorer.v.weight.squeeze(0))
    got = scorer(query, keys)
    torch.testing.assert_close(got, plain, rtol=1e-12, atol=1e-12)
    weight = torch.randn(got.shape, dtype=torch.float64)
    grads = torch.autograd.grad((got * weight).sum(), list(scorer.parameters()),
                                retain_graph=True)
    want = torch.autograd.grad((plain * weight).sum(), list(scorer.parameters()))
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_unknown_name_lists_the_valid_ones():
    assert set(ATTENTIONS) == {"none", "bahdanau", "luong"}
    with pytest.raises(ConfigError) as err:
        build_attention(AttentionConfig(name="bahdanou"), ENC, DEC)
    message = str(err.value)
    assert "bahdanou" in message
    assert all(name in message for name in ATTENTIONS)


def test_unknown_luong_score_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        build_attention(AttentionConfig(name="luong", score="cosine"), ENC, DEC)
    message = str(err.value)
    assert "cosine" in message
    assert all(score in message for score in LUONG_SCORES)


def test_memory_index_select_reorders_every_field():
    att = build_attention(AttentionConfig(name="none"), ENC, DEC)
    h, mask = _inputs()
    memory = att.init(h, mask)
    idx = torch.tensor([2, 2, 0])
    picked = memory.index_select(idx)
    assert torch.equal(picked.values, h[idx])
    assert torch.equal(picked.context, memory.context[idx])
    assert torch.equal(picked.mask_bias, memory.mask_bias[idx])


def test_step_scores_backward_matches_gradcheck():
    """The one-step bilinear scores' hand-written backward (attention._StepScores)."""
    from seq2seq.model.scorers import _StepScores

    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 5, 4, generator=gen, dtype=torch.double, requires_grad=True)
    q = torch.randn(3, 4, generator=gen, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(_StepScores.apply, (keys, q))
    torch.testing.assert_close(_StepScores.apply(keys, q), torch.einsum("bsq,bq->bs", keys, q))
