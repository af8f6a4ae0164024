"""A GRU's gates from its two products, written out: torch ops, or the C kernels.

h' = (1 - z) n + z h with r = σ(i_r + h_r), z = σ(i_z + h_z), n = tanh(i_n + r h_n)
(torch's GRU), from gi = W_i x + b_i and gh = W_h h + b_h, each (rows, 3H) in the order
(r, z, n). :func:`forward` also returns ``keep`` = (r, z, n) (rows, 3H), all that
:func:`backward` needs besides gh and h. The same two functions serve one step as an
autograd node (:class:`_GRUGates`, the decoder's loop) and a whole sequence with its own
backward loop (seq2seq/model/encoder_rnn.py). ``fast``: the C kernels of seq2seq/native
(fp32 CPU tensors only), used where ``native.choose`` times them faster.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq import native


def forward(gi: Tensor, gh: Tensor, h: Tensor, fast: bool, out: Tensor | None = None,
            keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """gi, gh (rows, 3H), h (rows, H) -> h' (rows, H), keep (rows, 3H); written into
    ``out``/``keep`` when given (contiguous, the computing dtype). No autograd."""
    if fast:
        return native.gru_gates(gi, gh, h, out, keep)  # type: ignore[return-value]
    dtype = torch.promote_types(gi.dtype, h.dtype)
    width = h.size(1)
    if keep is None:
        keep = gi.new_empty(gi.shape, dtype=dtype)
    i_r, i_z, i_n = gi.to(dtype).chunk(3, 1)
    h_r, h_z, h_n = gh.to(dtype).chunk(3, 1)
    r = torch.sigmoid(i_r + h_r, out=keep[:, :width])
    z = torch.sigmoid(i_z + h_z, out=keep[:, width:2 * width])
    n = torch.tanh(torch.addcmul(i_n, r, h_n), out=keep[:, 2 * width:])
    if out is None:
        return torch.lerp(n, h.to(dtype), z), keep  # n + z (h - n)
    return torch.lerp(n, h.to(dtype), z, out=out), keep


def backward(grad: Tensor, keep: Tensor, gh: Tensor, h: Tensor, fast: bool,
             grad_gi: Tensor | None = None, grad_gh: Tensor | None = None
             ) -> tuple[Tensor, Tensor, Tensor]:
    """grad (rows, H) of h' -> grads of gi, gh (rows, 3H) and h (rows, H); the first two
    written into ``grad_gi``/``grad_gh`` when given."""
    if fast:
        return native.gru_gates_backward(grad, keep, gh, h, grad_gi, grad_gh)
    r, z, n = keep.chunk(3, 1)
    grad = grad.to(keep.dtype)
    h_n = gh.to(keep.dtype).chunk(3, 1)[2]
    d_n = grad * (1 - z) * (1 - n * n)  # through tanh
    d_z = grad * (h.to(keep.dtype) - n) * z * (1 - z)  # through σ
    d_r = d_n * h_n * r * (1 - r)
    grad_gi = torch.cat([d_r, d_z, d_n], 1, out=grad_gi) if grad_gi is not None \
        else torch.cat([d_r, d_z, d_n], 1)
    grad_gh = torch.cat([d_r, d_z, d_n * r], 1, out=grad_gh) if grad_gh is not None \
        else torch.cat([d_r, d_z, d_n * r], 1)
    return grad_gi, grad_gh, grad * z


def use_kernels(*tensors: Tensor) -> bool:
    """Whether the C kernels take these tensors: fp32 on the CPU, and timed faster here."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) \
        and native.choose("gru_gates with gradients", _gates_trial)


class _GRUGates(torch.autograd.Function):
    """One step's gates as one autograd node instead of a dozen."""

    @staticmethod
    def forward(ctx, gi: Tensor, gh: Tensor, h: Tensor, fast: bool) -> Tensor:
        ctx.fast = fast
        out, keep = forward(gi, gh, h, fast)
        ctx.save_for_backward(keep, gh, h)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        keep, gh, h = ctx.saved_tensors
        return (*backward(grad, keep, gh, h, ctx.fast), None)


def gru_gates(gi: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """:class:`_GRUGates`: gi, gh (B, 3H), h (B, H) -> h' (B, H); the C kernels where they
    apply and are timed faster."""
    return _GRUGates.apply(gi, gh, h, use_kernels(gi, gh, h))


def _gates_trial() -> tuple[Callable[[], object], Callable[[], object]]:
    """native.choose's problem: one step of 96 sentences, GRU 256, forward and backward."""
    gen = torch.Generator().manual_seed(0)
    gi, gh, h = (torch.randn(96, size, generator=gen).requires_grad_() for size in (768, 768, 256))
    up = torch.randn(96, 256, generator=gen)

    def run(fast: bool) -> Callable[[], object]:
        def both_directions() -> object:
            with torch.enable_grad():  # the first call may come from a no-grad validation
                return torch.autograd.grad(_GRUGates.apply(gi, gh, h, fast), (gi, gh, h), up)
        return both_directions
    return run(False), run(True)
