"""Attention scores: what ``Attention.attend`` turns into weights over source positions.

- ``AdditiveScorer``: e_j = vᵀ tanh(W q + U h_j) (Bahdanau; Luong's ``concat``), computed
  through the sigmoid, and without gradients by the fused C kernel where it is faster
  (seq2seq/native).
- ``BilinearScorer``: e_j = qᵀ W h_j or qᵀ h_j (Luong's ``general`` and ``dot``), with a
  hand-written backward for one step (``_StepScores``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq import native
from seq2seq.model import bf16_gemm
from seq2seq.model.deferred import DeferredGrad, SummedGrad, deferring


class AdditiveScorer(nn.Module):
    """e_j = vᵀ tanh(W q + U h_j); U h_j is the precomputed key (batch, S, attn_size).

    Computed through tanh(z) = 2σ(2z) - 1, so e_j = (2v)ᵀ σ(2(W q + U h_j)) - Σv: the
    same scores up to rounding, but torch's CPU sigmoid is several times faster than its
    tanh, and this (batch, [T,] S, attn_size) nonlinearity is the largest pointwise cost
    of Bahdanau attention in training and decoding (docs/performance.md#additive-attention-through-the-sigmoid).
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_size, attn_size, bias=False)
        self.key_proj = nn.Linear(key_size, attn_size)
        self.v = nn.Linear(attn_size, 1, bias=False)

    def keys(self, h: Tensor) -> Tensor:
        """(B, S, key_size) -> (B, S, attn_size)."""
        return bf16_gemm.linear(h, self.key_proj.weight, self.key_proj.bias)

    def sums_key_grads(self, keys: Tensor | None) -> bool:
        """Whether a teacher-forced loop should give these keys a SummedGrad: they need a
        gradient and the steps' scores will go through the C kernels (fp32 CPU, no
        autocast, timed faster), whose backward adds into the loop's buffer."""
        return deferring(keys) and keys.device.type == "cpu" \
            and keys.dtype == torch.float32 and not torch.is_autocast_enabled("cpu") \
            and native.choose("additive_scores with gradients", _grad_trial)

    def forward(self, query: Tensor, keys: Tensor, keys_grad: SummedGrad | None = None
                ) -> Tensor:
        """query (B, Q) or (B, T, Q), keys (B, S, A) -> scores (B, [T,] S).

        Without gradients (decoding, validation) the fused C kernel computes them where
        it is built and timed faster (seq2seq/native; float32 scores). ``keys_grad``: in
        a teacher-forced loop, where keys is its ``shared`` (first B rows)."""
        q2 = 2 * self.query_proj(query)
        if q2.device.type != "cpu":
            return additive_scores(q2, keys, self.v.weight)
        if not torch.is_grad_enabled():
            if native.choose(f"additive_scores/{q2.dtype}", _scores_trial(q2.dtype)):
                scores = native.additive_scores(q2, keys, self.v.weight)
                if scores is not None:
                    return scores
        elif q2.dtype == keys.dtype == torch.float32 \
                and native.choose("additive_scores with gradients", _grad_trial):
            if keys_grad is None:
                return _NativeScores.apply(q2, keys, self.v.weight)
            return _NativeScores.apply(q2, keys, self.v.weight, keys_grad.token,
                                       keys_grad.buffer[: keys.size(0)])
        if keys_grad is not None:  # the torch path: autograd forms the keys' gradient
            keys = keys_grad.tensor[: keys.size(0)]
        return additive_scores(q2, keys, self.v.weight)


def additive_scores(q2: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """The torch path of AdditiveScorer: q2 (B, [T,] A) = 2 W q, keys (B, S, A), v (1, A)
    -> 2 vᵀσ(q2 + 2 keys) - Σv, (B, [T,] S)."""
    if q2.dim() == 2:
        z2 = torch.add(q2.unsqueeze(1), keys, alpha=2)  # 2(Wq + U h_j) in one pass
    else:
        z2 = torch.add(q2.unsqueeze(2), keys.unsqueeze(1), alpha=2)
    return 2 * F.linear(z2.sigmoid_(), v.to(z2.dtype)).squeeze(-1) - v.sum()


def _scores_trial(dtype: torch.dtype) -> Callable[[], tuple[Callable[[], object],
                                                             Callable[[], object]]]:
    """native.choose's problem: 20 sentences x beam 5 against 40 source positions."""
    def trial() -> tuple[Callable[[], object], Callable[[], object]]:
        gen = torch.Generator().manual_seed(0)  # the global RNG stream stays untouched
        q2 = torch.randn(20, 5, 256, generator=gen).to(dtype)
        keys = torch.randn(20, 40, 256, generator=gen).to(dtype)
        v = torch.randn(1, 256, generator=gen) / 16
        return (lambda: additive_scores(q2, keys, v),
                lambda: native.additive_scores(q2, keys, v))
    return trial


class _NativeScores(torch.autograd.Function):
    """additive_scores (fp32) through the C kernels, forward and backward; the backward
    recomputes the sigmoid instead of keeping a (B, [T,] S, A) block for it. With a
    SummedGrad's ``token`` and ``buffer`` (its rows for these keys), the keys' gradient
    is added into the buffer (seq2seq/model/deferred.py)."""

    @staticmethod
    def forward(ctx, q2: Tensor, keys: Tensor, v: Tensor, token: Tensor | None = None,
                buffer: Tensor | None = None) -> Tensor:
        ctx.save_for_backward(q2, keys, v)
        ctx.buffer = buffer
        return native.additive_scores(q2, keys, v)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q2, keys, v = ctx.saved_tensors
        grad_q, grad_k, grad_v = native.additive_scores_backward(q2, keys, v, grad,
                                                                 ctx.buffer)
        token = None if ctx.buffer is None else grad.new_zeros(())
        return grad_q, grad_k, grad_v, token, None


def _grad_trial() -> tuple[Callable[[], object], Callable[[], object]]:
    """native.choose's problem with gradients: one training step's scores, 96 sentences
    against 35 source positions, forward and backward."""
    gen = torch.Generator().manual_seed(0)
    q2, keys, v = (torch.randn(*shape, generator=gen).requires_grad_()
                   for shape in ((96, 256), (96, 35, 256), (1, 256)))
    up = torch.randn(96, 35, generator=gen)

    def run(fn: Callable[..., Tensor]) -> Callable[[], object]:
        return lambda: torch.autograd.grad(fn(q2, keys, v), (q2, keys, v), up)
    return run(additive_scores), run(_NativeScores.apply)


class _StepScores(torch.autograd.Function):
    """scores (B, S) = K (B, S, Q) · q (B, Q) for one step, with a faster backward for q.

    Autograd's backward of bmm(K, q) forms grad q = Kᵀ g as a bmm over a transposed
    (B, Q, S) view, which torch's CPU kernels run much slower than the same product
    written g (B, 1, S) · K (B, S, Q); in a Luong training step the difference shows
    (docs/performance.md#luong-step-scores-with-a-hand-written-backward). The forward
    has the same trap the other way round: K (B, S, Q) · q (B, Q, 1), one matrix-vector
    product per sentence, runs several times slower than q (B, 1, Q) · Kᵀ (B, Q, S).
    """

    @staticmethod
    def forward(ctx, keys: Tensor, q: Tensor) -> Tensor:
        ctx.save_for_backward(keys, q)
        return torch.bmm(q.unsqueeze(1), keys.transpose(1, 2)).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        keys, q = ctx.saved_tensors
        grad_keys = grad_q = None
        if ctx.needs_input_grad[0]:
            grad_keys = torch.bmm(grad.unsqueeze(2), q.unsqueeze(1))
        if ctx.needs_input_grad[1]:
            grad_q = torch.bmm(grad.unsqueeze(1), keys).squeeze(1)
        return grad_keys, grad_q


class BilinearScorer(nn.Module):
    """e_j = qᵀ K_j with K_j = W h_j (``general``) or h_j (``dot``), optionally / sqrt(d).

    ``dot`` needs equal sizes; when the bidirectional encoder (2H) and the decoder (H)
    differ, h_j is projected to the decoder size first, as Luong's concat score does
    when sizes differ.
    """

    def __init__(self, query_size: int, key_size: int, project: bool, scale: bool) -> None:
        super().__init__()
        project = project or key_size != query_size
        self.key_proj = nn.Linear(key_size, query_size, bias=False) if project else None
        self.scale = 1.0 / math.sqrt(query_size) if scale else 1.0

    def keys(self, h: Tensor) -> Tensor:
        """(B, S, key_size) -> (B, S, query_size)."""
        # fp32 under bf16_gemm too: a dot-product score multiplies the keys' bf16 rounding
        # by |q|, and with bf16 keys Luong's 1,000-step dev loss rose 1.9% over fp32's for
        # one seed (docs/performance.md#the-large-products-in-bf16)
        return h if self.key_proj is None else self.key_proj(h)

    def forward(self, query: Tensor, keys: Tensor, keys_grad: DeferredGrad | None = None
                ) -> Tensor:
        """query (B, Q) or (B, T, Q), keys (B, S, Q) -> scores (B, [T,] S).

        keys_grad: in a step loop, attaches the (detached) keys' gradient.
        """
        q = query * self.scale if self.scale != 1.0 else query
        if query.dim() == 2:
            scores = _StepScores.apply(keys, q)
            return scores if keys_grad is None else keys_grad.add(scores, q)
        return torch.bmm(q, keys.transpose(1, 2))
