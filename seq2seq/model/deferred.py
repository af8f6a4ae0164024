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
and adds a slice of a zero tensor Z (B, T, N) made by ``_Deferred``. Autograd hands
``_Deferred.backward`` the gradients of all slices together, G, and by then the loop
has recorded every x_t, so it returns grad M = Aᵀ G (or Gᵀ A) in one call. The values
are unchanged (Z is zero); the gradients are equal up to float summation order
(tests/test_model.py checks both against the plain step loop).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _shared_grad(grad: Tensor, inputs: list[Tensor], on_right: bool) -> Tensor:
    """grad (B, T, N) of all steps' outputs and the recorded x_t -> the gradient of M."""
    steps, batch = len(inputs), grad.size(0)
    if all(x.size(0) == batch for x in inputs):
        x = torch.stack(inputs, dim=1)  # (B, steps, K)
    else:  # rows that had left the loop contribute nothing
        x = inputs[0].new_zeros(batch, steps, inputs[0].size(1))
        for t, x_t in enumerate(inputs):
            x[: x_t.size(0), t] = x_t
    g = grad[:, :steps]
    if on_right:  # M (B, K, N): Σ_t x_tᵀ g_t
        return torch.bmm(x.transpose(1, 2), g)
    return torch.bmm(g.transpose(1, 2), x)  # M (B, N, K): Σ_t g_t x_tᵀ


class _Deferred(torch.autograd.Function):
    """Zeros (B, T, N) whose backward turns their gradient into the shared tensor's.

    ctx keeps only the list the loop appends x_t to, never the DeferredGrad: that
    object holds this node's outputs, and a reference back from ctx would make a
    cycle through autograd's C++ graph that Python's garbage collector cannot see
    (every batch's encoder states would stay in memory).
    """

    @staticmethod
    def forward(ctx, shared: Tensor, inputs: list[Tensor], on_right: bool, steps: int,
                width: int) -> Tensor:
        ctx.inputs, ctx.on_right = inputs, on_right
        return shared.new_zeros(shared.size(0), steps, width)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        return _shared_grad(grad, ctx.inputs, ctx.on_right), None, None, None, None


class DeferredGrad:
    """One shared tensor M (B, K, N) or (B, N, K) used once per step as a batched product.

    ``shared_on_right``: y_t = x_t M, x_t (B, K), M (B, K, N), y_t (B, N) (the context);
    otherwise y_t = M x_t, M (B, N, K), x_t (B, K), y_t (B, N) (bilinear scores).
    ``shared``: what the loop multiplies with (M detached). ``add(y, x)`` returns y_t
    plus the next step's zero slice and records x_t.
    """

    def __init__(self, tensor: Tensor, steps: int, shared_on_right: bool) -> None:
        self.shared = tensor.detach()
        self.inputs: list[Tensor] = []
        width = tensor.size(2) if shared_on_right else tensor.size(1)
        self._slices = _Deferred.apply(tensor, self.inputs, shared_on_right, steps,
                                       width).unbind(1)

    def add(self, y: Tensor, x: Tensor) -> Tensor:
        """y (b, N) computed with the first b rows of ``shared`` from x (b, K) -> y with
        M's gradient attached (b < B when finished sentences have left the loop)."""
        step = len(self.inputs)
        self.inputs.append(x.detach())
        return y + self._slices[step][: y.size(0)]


def deferring(tensor: Tensor | None) -> bool:
    """Whether a loop should defer ``tensor``'s gradient (it needs one, and grad mode is on)."""
    return tensor is not None and tensor.requires_grad and torch.is_grad_enabled()
