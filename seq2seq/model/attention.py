"""The three attentions behind one interface; the only module that knows their names.

Every attention has ``init(h, mask) -> AttentionMemory`` (run once per batch: it
projects the keys) and ``forward(query, memory) -> (context, weights)``. A query is
either one step ``(batch, query_size)`` or all steps at once ``(batch, T, query_size)``;
the context and weights follow: ``(batch, [T,] context_size)`` and
``(batch, [T,] src_len)``. Masked source positions get exactly zero weight.

The decoder never tests a name. It reads three flags that say what an attention needs:

- ``query_before_rnn``: the query is the previous state s_{t-1} and the context is
  part of the RNN input (Bahdanau, none); otherwise the query is the new state h_t
  (Luong).
- ``query_free``: the context ignores the query (none), so it is known for all steps
  before the RNN runs.
- ``feeds_input``: the previous attentional vector is part of the RNN input (Luong's
  input feeding).
- ``output_reads_embedding``: the output layer also reads E y_{t-1} (deep output).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.config import AttentionName, LuongScore
from seq2seq.errors import ConfigError
from seq2seq.model.deferred import DeferredGrad, SummedGrad, deferring
from seq2seq.model.scorers import AdditiveScorer, BilinearScorer


@dataclass
class AttentionMemory:
    """What an attention precomputes from the encoder once per batch.

    values: (batch, src_len, enc_size) the encoder states the context averages.
    mask_bias: (batch, src_len) 0 at real tokens, -inf at padding (added to scores).
    keys: (batch, src_len, key_size) projected keys, or None.
    context: (batch, context_size) a fixed context (``none``), or None.
    values_grad, keys_grad: set only in a teacher-forced step loop (``loop_memory``):
    values/keys are then detached and these attach their gradients once per loop.
    group: how many consecutive query rows each memory row serves (``repeat_rows``):
    beam search's hypotheses of one sentence share its memory, which each step then
    reads once per sentence instead of once per hypothesis.
    """

    values: Tensor
    mask_bias: Tensor
    keys: Tensor | None = None
    context: Tensor | None = None
    values_grad: DeferredGrad | None = None
    keys_grad: DeferredGrad | SummedGrad | None = None
    group: int = 1

    def repeat_rows(self, k: int) -> AttentionMemory:
        """The memory of a batch whose query rows come ``k`` per row of this one,
        consecutive (row i serves query rows i*k ... i*k+k-1); no field is copied."""
        return replace(self, group=self.group * k)

    def index_select(self, index: Tensor) -> AttentionMemory:
        """Query rows ``index`` (new_rows,) of every field: beam search reorders with this.
        A grouped memory keeps whole groups only (beam search drops whole sentences)."""
        if self.group > 1:
            index = _whole_groups(index, self.group)
        return AttentionMemory(
            values=self.values.index_select(0, index),
            mask_bias=self.mask_bias.index_select(0, index),
            keys=None if self.keys is None else self.keys.index_select(0, index),
            context=None if self.context is None else self.context.index_select(0, index),
            group=self.group,
        )

    def head(self, rows: int) -> AttentionMemory:
        """The first ``rows`` rows (views), deferred gradients kept: a step loop whose
        finished sentences (sorted last) drop out uses this."""
        def cut(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[:rows]

        return replace(self, values=self.values[:rows], mask_bias=self.mask_bias[:rows],
                       keys=cut(self.keys), context=cut(self.context))


def _whole_groups(index: Tensor, group: int) -> Tensor:
    """Query rows (n * group,) that are whole groups in order -> their memory rows (n,)."""
    rows = index.view(-1, group)
    first = rows[:, :1]
    whole = (first % group == 0) & (rows - first == torch.arange(group, device=index.device))
    if not bool(whole.all()):
        raise ValueError(f"a memory grouped by {group} can only keep whole groups of rows")
    return first.squeeze(1) // group


def _mask_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(batch, src_len) bool, True = real token -> additive bias 0 / -inf.

    Built once per batch so no step allocates a mask; exp(-inf) = 0 exactly.
    """
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(~mask, float("-inf"))


def _attend(scores: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
    """Masked softmax over source positions, then the weighted average of the values.

    scores: (B, S) or (B, T, S) -> context (B, [T,] enc_size), weights like scores.
    """
    if scores.dim() == 2:
        weights = torch.softmax(scores + memory.mask_bias, dim=-1)
        context = torch.bmm(weights.unsqueeze(1), memory.values).squeeze(1)
        if memory.values_grad is not None:
            context = memory.values_grad.add(context, weights)
    else:
        weights = torch.softmax(scores + memory.mask_bias.unsqueeze(1), dim=-1)
        context = torch.bmm(weights, memory.values)
    return context, weights


class Attention(nn.Module):
    """Base class: the flags the decoder reads, and the sizes it builds layers with."""

    query_before_rnn: bool = True
    query_free: bool = False
    feeds_input: bool = False
    output_reads_embedding: bool = True

    def __init__(self, enc_size: int, dec_size: int) -> None:
        super().__init__()
        self.enc_size = enc_size
        self.dec_size = dec_size
        self.context_size = enc_size

    def init(self, h: Tensor, mask: Tensor) -> AttentionMemory:
        """h (B, S, enc_size), mask (B, S) bool True = real token -> memory."""
        raise NotImplementedError

    def forward(self, query: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        """query (B, [T,] dec_size) -> context (B, [T,] enc_size), weights (B, [T,] S).

        With a grouped memory (``AttentionMemory.repeat_rows``) a one-step query has
        ``group`` rows per memory row; they are scored as the steps of one sentence
        are, (B_mem, group, dec_size), so each sentence's keys and values are read once.
        """
        if memory.group > 1 and query.dim() == 2:
            context, weights = self.attend(query.view(-1, memory.group, query.size(-1)), memory)
            return context.flatten(0, 1), weights.flatten(0, 1)
        return self.attend(query, memory)

    def attend(self, query: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        """As ``forward``, with as many query rows as memory rows."""
        raise NotImplementedError

    def loop_memory(self, memory: AttentionMemory, rows: list[int]) -> AttentionMemory:
        """The memory for a teacher-forced loop of one-step calls, step t on the first
        ``rows[t]`` rows (non-increasing).

        Same values, but the gradient of the encoder states the context averages is
        formed once for all steps (seq2seq/model/deferred.py); unchanged without grad mode.
        """
        if not deferring(memory.values):
            return memory
        values = DeferredGrad(memory.values, rows, shared_on_right=True)
        return replace(memory, values=values.shared, values_grad=values)


class NoAttention(Attention):
    """RNNencdec (Cho et al. 2014): c = tanh(W_c [fwd h_S ; bwd h_1]) for every step.

    The query is ignored (only its shape says whether one or T steps are asked
    for); the weights are all zero, so plots show the model looks nowhere.
    """

    query_free = True

    def __init__(self, enc_size: int, dec_size: int, bidirectional: bool = True) -> None:
        super().__init__(enc_size, dec_size)
        self.bidirectional = bidirectional
        self.proj = nn.Linear(enc_size, enc_size)

    def init(self, h: Tensor, mask: Tensor) -> AttentionMemory:
        last = mask.sum(dim=1) - 1  # (B,) index of each sentence's last real token
        rows = torch.arange(h.size(0), device=h.device)
        if self.bidirectional:
            half = self.enc_size // 2
            # the forward RNN has read the whole sentence at its last token, the backward at 0
            summary = torch.cat([h[rows, last, :half], h[:, 0, half:]], dim=-1)
        else:
            summary = h[rows, last]
        context = torch.tanh(self.proj(summary))  # (B, enc_size)
        return AttentionMemory(values=h, mask_bias=_mask_bias(mask, h.dtype), context=context)

    def loop_memory(self, memory: AttentionMemory, rows: list[int]) -> AttentionMemory:
        return memory  # the fixed context never reads the values

    def attend(self, query: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        context = memory.context
        assert context is not None, "NoAttention needs the memory from NoAttention.init"
        zeros = memory.mask_bias.new_zeros(memory.mask_bias.shape)
        if query.dim() == 2:
            return context, zeros
        steps = query.size(1)
        return (context.unsqueeze(1).expand(-1, steps, -1),
                zeros.unsqueeze(1).expand(-1, steps, -1))


class BahdanauAttention(Attention):
    """Additive attention, query = previous decoder state s_{t-1} (Bahdanau et al. 2015)."""

    def __init__(self, enc_size: int, dec_size: int, attn_size: int) -> None:
        super().__init__(enc_size, dec_size)
        self.scorer = AdditiveScorer(dec_size, enc_size, attn_size)

    def init(self, h: Tensor, mask: Tensor) -> AttentionMemory:
        return AttentionMemory(values=h, mask_bias=_mask_bias(mask, h.dtype),
                               keys=self.scorer.keys(h))

    def loop_memory(self, memory: AttentionMemory, rows: list[int]) -> AttentionMemory:
        return _summed_keys(super().loop_memory(memory, rows), self.scorer)

    def attend(self, query: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        return _attend(self.scorer(query, memory.keys, memory.keys_grad), memory)


def _summed_keys(memory: AttentionMemory, scorer: AdditiveScorer) -> AttentionMemory:
    """An additive scorer's loop memory: the keys' per-step gradients added into one
    buffer (deferred.SummedGrad) where the scores run through the C kernels."""
    if not scorer.sums_key_grads(memory.keys):
        return memory
    keys = SummedGrad(memory.keys)  # type: ignore[arg-type]
    return replace(memory, keys=keys.shared, keys_grad=keys)


class LuongAttention(Attention):
    """Global attention, query = current state h_t (Luong et al. 2015).

    The decoder forms h~_t = tanh(W_c [c_t; h_t]) and, with input feeding, feeds it
    to the next step.
    """

    query_before_rnn = False
    output_reads_embedding = False

    def __init__(self, enc_size: int, dec_size: int, score: str, attn_size: int,
                 input_feeding: bool = True, deep_output: bool = False) -> None:
        super().__init__(enc_size, dec_size)
        self.score = score
        self.feeds_input = input_feeding
        self.output_reads_embedding = deep_output
        if score == "concat":
            self.scorer: nn.Module = AdditiveScorer(dec_size, enc_size, attn_size)
        else:
            self.scorer = BilinearScorer(dec_size, enc_size, project=score == "general",
                                         scale=score == "scaled_dot")

    def init(self, h: Tensor, mask: Tensor) -> AttentionMemory:
        return AttentionMemory(values=h, mask_bias=_mask_bias(mask, h.dtype),
                               keys=self.scorer.keys(h))

    def loop_memory(self, memory: AttentionMemory, rows: list[int]) -> AttentionMemory:
        memory = super().loop_memory(memory, rows)
        if isinstance(self.scorer, AdditiveScorer):
            return _summed_keys(memory, self.scorer)
        if not deferring(memory.keys):
            return memory
        keys = DeferredGrad(memory.keys, rows, shared_on_right=False)
        return replace(memory, keys=keys.shared, keys_grad=keys)

    def attend(self, query: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        if memory.keys_grad is not None:
            return _attend(self.scorer(query, memory.keys, memory.keys_grad), memory)
        return _attend(self.scorer(query, memory.keys), memory)


def _build_none(att_cfg, enc_size: int, dec_size: int, bidirectional: bool) -> Attention:
    return NoAttention(enc_size, dec_size, bidirectional=bidirectional)


def _build_bahdanau(att_cfg, enc_size: int, dec_size: int, bidirectional: bool) -> Attention:
    return BahdanauAttention(enc_size, dec_size, att_cfg.attn_size or dec_size)


def _build_luong(att_cfg, enc_size: int, dec_size: int, bidirectional: bool) -> Attention:
    if att_cfg.score not in LUONG_SCORES:
        raise ConfigError(f"model.attention.score={att_cfg.score!r} is not a Luong score: "
                          f"use one of {', '.join(LUONG_SCORES)}")
    return LuongAttention(enc_size, dec_size, att_cfg.score, att_cfg.attn_size or dec_size,
                          input_feeding=bool(att_cfg.input_feeding),
                          deep_output=bool(getattr(att_cfg, "deep_output", False)))


LUONG_SCORES = tuple(LuongScore)
# The registry: model/attention=<name> picks the builder; add an attention here.
ATTENTIONS: dict[str, Callable[[Any, int, int, bool], Attention]] = {
    AttentionName.none: _build_none,
    AttentionName.bahdanau: _build_bahdanau,
    AttentionName.luong: _build_luong,
}


def build_attention(att_cfg: Any, enc_size: int, dec_size: int,
                    bidirectional: bool = True) -> Attention:
    """Build the attention named by ``att_cfg.name`` (an AttentionConfig or DictConfig).

    enc_size: size of one encoder state (2H when bidirectional); dec_size: decoder
    hidden size. Raises ConfigError naming the valid choices for an unknown name or
    Luong score.
    """
    builder = ATTENTIONS.get(att_cfg.name)
    if builder is None:
        raise ConfigError(f"model.attention.name={att_cfg.name!r} is unknown: use one of "
                          f"{', '.join(ATTENTIONS)} (e.g. model/attention=bahdanau)")
    return builder(att_cfg, enc_size, dec_size, bidirectional)
