"""The large fp32 products of a training step in bf16, rows padded so their shapes recur.

``train.precision=bf16_gemm`` (seq2seq.precision) keeps the model, the recurrences, the
attention and the softmax/loss in fp32 and runs in bf16 the products that have thousands
of rows: the fused output layer and loss (:func:`seq2seq.model.loss.bf16_products`) and,
here, the products over every position of a batch at once: the encoder's input
projection, the decoder's embedding product, Bahdanau's keys' projection (dot-product
keys stay fp32, seq2seq/model/scorers.py), the readout, and the weight gradients the
decoder's step loop forms once after it (seq2seq/model/deferred.py). On a CPU with AMX these run 2-3x faster in bf16 than in fp32
even with the casts (docs/performance.md#the-large-products-in-bf16).

bf16 inputs, fp32 accumulation (oneDNN's), results rounded to bf16 and returned in fp32,
as under autocast; a bias joins the bf16 product (as under autocast) and its gradient is
summed in fp32. The per-step products of the loop
(tens of rows) stay fp32: in bf16 they gain little and meet a new shape at almost every
step.

oneDNN builds a kernel for every new shape, ~25 ms each on the CPU measured, and a
batch's row count is new almost every batch. So the rows are zero-padded up to a multiple
of :data:`ROW_STEP` (:func:`_padded`): a run meets a handful of row counts per product,
and zero rows add nothing to a weight's gradient. Without autocast nothing would cast
these products (autocast would also cast the per-step ones), so the three products of
each are written out here (:class:`_Linear`).

The decision is taken in the forward pass (:func:`applies`); the backward, which runs
after the precision's block has ended, follows it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_ROWS = 512  # fewer rows: the product stays fp32 (per-step products, decoding, tests)
ROW_STEP = 256  # rows are padded to a multiple of this: a few shapes per run
_on = False  # set by enabled()


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Inside the block, :func:`linear` and :func:`weight_grad` multiply large fp32 CPU
    operands in bf16; restores what it found."""
    global _on
    before, _on = _on, on
    try:
        yield
    finally:
        _on = before


def active() -> bool:
    """Whether a block of :func:`enabled` is open."""
    return _on


def applies(x: Tensor) -> bool:
    """Whether a product with ``x`` (..., K) as its rows runs in bf16 here: inside
    :func:`enabled`, fp32 on the CPU outside autocast, at least MIN_ROWS rows."""
    return (_on and x.device.type == "cpu" and x.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and x.numel() >= MIN_ROWS * x.size(-1))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``: x (..., K), weight (N, K), bias (N,) -> (..., N), in bf16 where
    :func:`applies`."""
    if not applies(x):
        return F.linear(x, weight, bias)
    out = _Linear.apply(x.reshape(-1, x.size(-1)), weight, bias)
    return out.view(*x.shape[:-1], weight.size(0))


def weight_grad(grad: Tensor, x: Tensor, bf16: bool) -> Tensor:
    """gradᵀ x: grad (M, N), x (M, K) -> (N, K) in grad's dtype; with ``bf16`` and at
    least MIN_ROWS rows, multiplied in bf16 (fp32 accumulation)."""
    if not bf16 or x.size(0) < MIN_ROWS or grad.dtype != torch.float32:
        return torch.mm(grad.t(), x.to(grad.dtype))
    rows = _rounded(x.size(0))
    return torch.mm(_padded(grad, rows).t(), _padded(x, rows)).float()


def batched_weight_grad(grad: Tensor, x: Tensor) -> Tensor:
    """Σ over (S, B) of gradᵀ x per leading index: grad (D, S, B, N), x (D, S, B, K), any
    strides -> (D, N, K) fp32, multiplied in bf16 (the S*B rows padded)."""
    dirs, steps, batch = grad.shape[:3]
    rows = _rounded(steps * batch)
    g, h = (_padded_rows(t, rows) for t in (grad, x))
    return torch.bmm(g.transpose(1, 2), h).float()


def _padded_rows(t: Tensor, rows: int) -> Tensor:
    """t (D, S, B, C) -> bf16 (D, rows, C): its S*B rows, then zero rows."""
    dirs, steps, batch, width = t.shape
    out = t.new_empty(dirs, rows, width, dtype=torch.bfloat16)
    out[:, : steps * batch].view(dirs, steps, batch, width).copy_(t)
    out[:, steps * batch:].zero_()
    return out


def _rounded(rows: int) -> int:
    return -(-rows // ROW_STEP) * ROW_STEP


def _padded(t: Tensor, rows: int) -> Tensor:
    """t (r, C) -> bf16 (rows, C), t's rows then zero rows, in one cast-copy."""
    out = t.new_empty(rows, t.size(1), dtype=torch.bfloat16)
    out[: t.size(0)] = t
    out[t.size(0):].zero_()
    return out


class _Linear(torch.autograd.Function):
    """x (M, K) fp32 -> x Wᵀ + b (M, N) fp32, the three products in bf16 on padded rows.

    Keeps the padded bf16 copies of x and W for the backward (half of x's fp32 bytes)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = x.size(0)
        xb = _padded(x, _rounded(rows))
        wb = weight.to(torch.bfloat16)
        # the bias joins the product in bf16, as under autocast: the sum is rounded to
        # bf16 anyway, and an fp32 add of a bf16 product is a slow mixed-dtype pass
        y = (torch.mm(xb, wb.t()) if bias is None
             else torch.addmm(bias.to(torch.bfloat16), xb, wb.t()))
        ctx.save_for_backward(xb, wb)
        ctx.rows, ctx.has_bias = rows, bias is not None
        return y[:rows].float()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        xb, wb = ctx.saved_tensors
        gb = _padded(grad, xb.size(0))
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.mm(gb, wb)[: ctx.rows].float()
        if ctx.needs_input_grad[1]:
            grad_w = torch.mm(gb.t(), xb).float()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b
