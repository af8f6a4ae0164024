"""Gradients of a tensor shared by every decoder step, summed in one matmul after the loop.

In the teacher-forced step loop each step multiplies a small per-step tensor x_t by
the same shared tensor M: the attention context c_t = α_t V (V: the encoder states)
and Luong's scores e_t = K q_t (K: the projected keys). Left to autograd, the
backward of every step forms its own outer product α_tᵀ g_t of size (B, S, 2H) and
adds it into M's gradient: T thin matmuls and T passes over a (B, S, 2H) buffer,
one of the largest costs of a training step on CPU
(docs/performance.md#deferred-gradients-of-the-attention-memory). The gradient is a
sum over steps, so it can be formed at once:
Σ_t α_tᵀ g_t = Aᵀ G with A = [α_1 … α_T] and G = [g_1 … g_T], one batched matmul.

How: each step uses ``M.detach()`` (its backward still gives the gradient of x_t)
and adds its block of a zero tensor Z (Σ rows, N) made by ``_Deferred``. Autograd hands
``_Deferred.backward`` the gradients of all slices together, G, and by then the loop
has recorded every x_t, so it returns grad M = Aᵀ G (or Gᵀ A) in one call. The values
are unchanged (Z is zero); the gradients are equal up to float summation order
(tests/test_model.py checks both against the plain step loop).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.model import bf16_gemm


def packed_positions(rows: list[int], batch: int, device: torch.device) -> Tensor:
    """The (Σ rows,) flat positions b * T + t in a (B, T) grid of a loop's rows packed
    time-major: step 0's first rows[0] rows, then step 1's first rows[1], ..."""
    lengths = torch.tensor(rows, device=device).unsqueeze(1)  # (T, 1)
    live = torch.arange(batch, device=device).unsqueeze(0) < lengths  # (T, B)
    t, b = live.nonzero(as_tuple=True)
    return b * len(rows) + t


def _batch_major(packed: Tensor, rows: list[int], batch: int) -> Tensor:
    """(Σ rows, N) packed time-major -> (B, T, N), zero where a row had left the loop."""
    steps, width = len(rows), packed.size(1)
    if all(r == batch for r in rows):
        return packed.view(steps, batch, width).transpose(0, 1)
    out = packed.new_zeros(batch * steps, width)
    out.index_copy_(0, packed_positions(rows, batch, packed.device), packed)
    return out.view(batch, steps, width)


def _shared_grad(grad: Tensor, inputs: list[Tensor], on_right: bool, batch: int) -> Tensor:
    """grad (Σ rows, N) of all steps' outputs, packed as their rows, and the recorded
    x_t (rows_t, K) -> the gradient of M: Σ_t x_tᵀ g_t per batch row, one bmm."""
    rows = [x.size(0) for x in inputs]
    x = _batch_major(torch.cat(inputs), rows, batch)  # (B, steps, K)
    g = _batch_major(grad[: sum(rows)], rows, batch)  # (B, steps, N)
    if on_right:  # M (B, K, N): Σ_t x_tᵀ g_t
        return torch.bmm(x.transpose(1, 2), g)
    return torch.bmm(g.transpose(1, 2), x)  # M (B, N, K): Σ_t g_t x_tᵀ


class _Deferred(torch.autograd.Function):
    """Zeros (Σ rows, N), one block of rows per step, whose backward turns their
    gradient into the shared tensor's.

    ctx keeps only the list the loop appends x_t to, never the DeferredGrad: that
    object holds this node's outputs, and a reference back from ctx would make a
    cycle through autograd's C++ graph that Python's garbage collector cannot see
    (every batch's encoder states would stay in memory).
    """

    @staticmethod
    def forward(ctx, shared: Tensor, inputs: list[Tensor], on_right: bool, total: int,
                width: int) -> Tensor:
        ctx.inputs, ctx.on_right, ctx.batch = inputs, on_right, shared.size(0)
        return shared.new_zeros(total, width)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        if not ctx.inputs:  # the loop never ran a step
            return None, None, None, None, None
        return _shared_grad(grad, ctx.inputs, ctx.on_right, ctx.batch), None, None, None, None


class DeferredGrad:
    """One shared tensor M (B, K, N) or (B, N, K) used once per step as a batched product.

    ``shared_on_right``: y_t = x_t M, x_t (B, K), M (B, K, N), y_t (B, N) (the context);
    otherwise y_t = M x_t, M (B, N, K), x_t (B, K), y_t (B, N) (bilinear scores).
    ``rows`` (T,): how many rows step t runs (the packed loop's, non-increasing).
    ``shared``: what the loop multiplies with (M detached). ``add(y, x)`` returns y_t
    plus the step's block of zeros and records x_t. The zeros are one packed (Σ rows, N)
    tensor split by steps, so their backward is one concatenation, not a zero-filled
    (B, N) block per step whose rows shrank.
    """

    def __init__(self, tensor: Tensor, rows: list[int], shared_on_right: bool) -> None:
        self.shared = tensor.detach()
        self.inputs: list[Tensor] = []
        width = tensor.size(2) if shared_on_right else tensor.size(1)
        self._blocks = _Deferred.apply(tensor, self.inputs, shared_on_right, sum(rows),
                                       width).split(rows)

    def add(self, y: Tensor, x: Tensor) -> Tensor:
        """y (b, N) computed with the first b rows of ``shared`` from x (b, K), b the
        step's rows -> y with M's gradient attached."""
        step = len(self.inputs)
        self.inputs.append(x.detach())
        return y + self._blocks[step]


class _SumAnchor(torch.autograd.Function):
    """A 0-dim zero that every step takes as an input, so autograd runs this node's
    backward only after all of theirs; it returns the buffer they added into.

    ctx keeps only the buffer, never the SummedGrad (see _Deferred)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, buffer: Tensor) -> Tensor:
        ctx.buffer = buffer
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.buffer, None


class SummedGrad:
    """A tensor M (B, ...) that every step of a loop reads whole, with a gradient of its
    own per step that is not a product (Bahdanau's keys: the additive score's gradient
    passes through a sigmoid at every position).

    Left to autograd, each step's gradient of M would be its own (B, S, A) tensor, added
    into the rest: T additions over M, and for the packed loop's shrinking rows a
    zero-filled copy each. Here each step's backward adds its part straight into one
    ``buffer`` (rows [:b] for a step of b rows), and ``token``, which each step takes as
    an input, hands the buffer to M's gradient after the last of them.
    """

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor  # attached, for a step that cannot add into the buffer
        self.shared = tensor.detach()
        self.buffer = torch.zeros_like(tensor, memory_format=torch.contiguous_format)
        self.token = _SumAnchor.apply(tensor, self.buffer)


def deferring(tensor: Tensor | None) -> bool:
    """Whether a loop should defer ``tensor``'s gradient (it needs one, and grad mode is on)."""
    return tensor is not None and tensor.requires_grad and torch.is_grad_enabled()


class _WeightAnchor(torch.autograd.Function):
    """``base`` (N, out) unchanged; its backward also forms the gradients of the weight
    that every step multiplied into its rows of ``base``, and of the bias (when given,
    ``base`` is that bias broadcast).

    ctx keeps only the list of inputs, never the LoopLinear (see _Deferred)."""

    @staticmethod
    def forward(ctx, base: Tensor, weight: Tensor, bias: Tensor | None,
                inputs: list[Tensor], bf16: bool) -> Tensor:
        ctx.inputs, ctx.has_bias, ctx.dtype = inputs, bias is not None, weight.dtype
        ctx.bf16 = bf16
        return base.view_as(base)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_base = grad if ctx.needs_input_grad[0] else None
        if not ctx.inputs:  # the loop never ran a step
            return grad_base, None, None, None, None
        x = torch.cat(ctx.inputs)  # (rows of all steps, in), packed as grad's rows are
        g = grad[: x.size(0)]
        grad_w = bf16_gemm.weight_grad(g, x, ctx.bf16).to(ctx.dtype)
        grad_b = None
        if ctx.has_bias:  # a bf16 sum over thousands of rows would lose digits
            grad_b = g.sum(0, dtype=torch.promote_types(g.dtype, torch.float32)).to(ctx.dtype)
        return grad_base, grad_w, grad_b, None, None


class LoopLinear:
    """y_t = base_t + x_t Wᵀ for the steps t of a loop, W's gradient formed once after it.

    The loop's steps run ``rows`` (T,) rows each; ``base`` (Σ rows, N) holds each step's
    rows after the previous step's (time-major, as the packed loop emits them). It is what
    each step's product is added to: a product formed for all steps before the loop (its
    gradient passes through), or else the ``bias`` broadcast (which then gets its gradient
    here). Left to autograd, each step would form a thin (N, rows) x (rows, K) product and
    add it into W's gradient: T products and T passes over W per batch. Here the gradient
    that reaches ``base`` and the recorded inputs give Σ_t g_tᵀ x_t as one product. W is
    cast to the products' dtype once per loop (autocast would cast a detached weight at
    every step).
    """

    def __init__(self, weight: Tensor, rows: list[int], base: Tensor | None = None,
                 bias: Tensor | None = None) -> None:
        dtype = base.dtype if base is not None else _compute_dtype(weight)
        if base is None:
            row = (bias.detach().to(dtype) if bias is not None
                   else weight.new_zeros(weight.size(0), dtype=dtype))
            base = row.expand(sum(rows), -1)
        self.weight_t = weight.detach().to(dtype).t()
        self.inputs: list[Tensor] = []
        self._record = torch.is_grad_enabled() and (
            weight.requires_grad or (bias is not None and bias.requires_grad))
        if self._record:
            # train.precision=bf16_gemm: the one product after the loop in bf16
            base = _WeightAnchor.apply(base, weight, bias, self.inputs, bf16_gemm.applies(base))
        self._bases = base.split(rows)
        self._step = 0

    def __call__(self, x: Tensor) -> Tensor:
        """x (rows, K) of the next step -> (rows, N)."""
        x = x.to(self.weight_t.dtype)
        if self._record:
            self.inputs.append(x.detach())
        base = self._bases[self._step]
        self._step += 1
        return torch.addmm(base, x, self.weight_t)


def _compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a product with ``weight`` runs in: autocast's where it is on."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype
