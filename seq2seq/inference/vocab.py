"""The vocabulary side of a decoding step: logits -> each row's best tokens and their
log-probabilities, where beam search spends a third of a batched step's time
(docs/performance.md#decoding).

:func:`best_tokens` is what search calls: the fused C kernel of seq2seq/native where it
is built and timed faster, else the torch path below (``_log_probs``, then ``row_topk``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq import native
from seq2seq.constants import BOS_ID, PAD_ID

__all__ = ["TOPK_BLOCK", "best_tokens", "row_topk"]


def _log_probs(logits: Tensor) -> Tensor:
    """(N, V) logits -> float32 log-probabilities; PAD and BOS can never be produced.

    Written in place over the fp32 copy of bf16 logits, or over fp32 ``logits`` themselves
    (every caller passes a step's fresh output and never reads it again): one (N, V)
    buffer instead of two, which the beam's per-step vocabulary work feels
    (docs/performance.md#decoding).
    """
    logp = logits.float()
    torch.log_softmax(logp, dim=-1, out=logp)
    logp[:, PAD_ID] = float("-inf")
    logp[:, BOS_ID] = float("-inf")
    return logp


def best_tokens(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(N, V) logits -> each row's ``k`` best log-probabilities (N, k) float32, best first,
    and their tokens (N, k); PAD and BOS are never chosen.

    The fused C kernel (seq2seq/native) where it is built and timed faster, else
    ``_log_probs`` then ``row_topk`` (k = 1: ``max``).
    """
    if logits.device.type == "cpu" \
            and native.choose(f"vocab_topk/{logits.dtype}", _vocab_trial(logits.dtype)):
        fast = native.vocab_topk(logits, k, (PAD_ID, BOS_ID))
        if fast is not None:
            return fast
    logp = _log_probs(logits)
    if k == 1:
        best, token = logp.max(dim=-1, keepdim=True)
        return best, token
    return row_topk(logp, k)


def _vocab_trial(dtype: torch.dtype) -> Callable[[], tuple[Callable[[], object],
                                                            Callable[[], object]]]:
    """native.choose's problem: 100 beam rows over 8,000 entries, top 10 (both paths
    get a fresh copy, as each step's logits are)."""
    def trial() -> tuple[Callable[[], object], Callable[[], object]]:
        gen = torch.Generator().manual_seed(0)  # the global RNG stream stays untouched
        x = (4 * torch.randn(100, 8000, generator=gen)).to(dtype)
        return (lambda: row_topk(_log_probs(x.clone()), 10),
                lambda: native.vocab_topk(x.clone(), 10, (PAD_ID, BOS_ID)))
    return trial


TOPK_BLOCK = 64  # vocabulary entries per block in row_topk's first stage


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` of (N, V) rows in two stages: the k blocks of TOPK_BLOCK
    entries with the largest maxima, then the k largest of those blocks' entries.

    Exact: fewer than k entries exceed one of a row's k largest, so fewer than k blocks
    have a larger maximum and its block is among the k kept. torch's CPU topk copies
    every (value, index) pair of a row before selecting; the first stage only reads
    the row once for its block maxima (docs/performance.md#decoding). The values are
    torch.topk's; among equal values the indices may differ (torch leaves that order
    unspecified too).
    """
    n, width = x.shape
    blocks = width // TOPK_BLOCK
    if blocks < 2 * k:  # a small vocabulary: nothing to gain
        return x.topk(k, dim=1)
    head = x[:, : blocks * TOPK_BLOCK].reshape(n, blocks, TOPK_BLOCK)
    _, best = head.amax(dim=2).topk(k, dim=1)  # (N, k) block numbers
    offsets = torch.arange(TOPK_BLOCK, device=x.device)
    idx = (best.unsqueeze(2) * TOPK_BLOCK + offsets).view(n, k * TOPK_BLOCK)
    if blocks * TOPK_BLOCK < width:  # the last, partial block is always a candidate
        tail = torch.arange(blocks * TOPK_BLOCK, width, device=x.device).expand(n, -1)
        idx = torch.cat([idx, tail], dim=1)
    values, pos = x.gather(1, idx).topk(k, dim=1)
    return values, idx.gather(1, pos)
