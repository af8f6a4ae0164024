"""Matrix products through oneDNN on a grid of shapes, so its kernel cache stays small.

oneDNN builds and caches one kernel per product shape (docs/performance.md#fp32-gemms-through-onednn).
A training step meets ~100 shapes it has not met before: per-step batch sizes of the
packed decoder loop, batch x length rows, each batch's source length. Routed as they
are, those products build kernels all the time. Here every dimension that varies is
rounded up to a grid value first (:func:`grid`: multiples of 16 up to 64, then eight
values per octave, so at most 12.5% extra rows above 64), the operands are zero-padded
to it, and the result is cut back. Zero rows and zero inner columns change nothing in
the rows kept, so a padded product equals the unpadded one up to fp32 rounding. Model
sizes such as 256, 512, 768 and 1024 are grid values already, so weights are never
copied; a product whose output columns are off the grid, or with a side over
:data:`LIMIT`, runs as it is, on whatever route the caller set (the fused loss's
vocabulary-wide chunks have their own route, :func:`seq2seq.model.gemm.recurring`).

The products are torch's own: :func:`on_grid` replaces the CPU kernels of ``aten::mm``
and ``aten::addmm`` inside its block (autograd's backward products included) with
:func:`mm` and :func:`addmm`, which call the ``out=`` overloads with oneDNN's flag set.
No library offers this: oneDNN and torch key their caches on exact shapes.

Which dtypes go on the grid is the caller's choice (:func:`on_grid`'s ``dtypes``): fp32
products for the fp32 route, bf16 ones under bf16 autocast when asked
(:func:`seq2seq.model.gemm.for_bf16`). torch sends bf16 CPU products to oneDNN anyway,
so for them the grid only bounds the kernel builds.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

LIMIT = 4096  # larger sides run as they are: padding them would copy MBs per product
_FLAGS = torch.backends.mkldnn.matmul if hasattr(torch.backends.mkldnn, "matmul") else None
calls = {"grid": 0, "as_is": 0}  # how many products took each way (tests and diagnostics)
_accepted: tuple[torch.dtype, ...] = (torch.float32,)  # dtypes mm/addmm put on the grid


def grid(d: int) -> int:
    """The smallest grid value >= d: multiples of 16 up to 64, then 8 steps per octave."""
    if d <= 64:
        return -(-d // 16) * 16
    step = 1 << (d.bit_length() - 4)
    return -(-d // step) * step


def _fits(a: Tensor, b: Tensor, n: int) -> bool:
    """Whether a product (a @ b, n output columns) goes on the grid."""
    return (a.dtype == b.dtype and a.dtype in _accepted and grid(n) == n
            and min(a.size(0), a.size(1)) > 0 and max(a.size(0), a.size(1), n) <= LIMIT)


def _pad(t: Tensor, rows: int, cols: int) -> Tensor:
    """t (r, c) zero-padded to (rows, cols); t itself when it has that shape."""
    if t.shape == (rows, cols):
        return t
    out = t.new_zeros(rows, cols)
    out[:t.size(0), :t.size(1)] = t
    return out


@contextlib.contextmanager
def flag(onednn: bool) -> Iterator[None]:
    """Inside the block, fp32 mm/addmm go through oneDNN (``onednn``) or torch's default
    (MKL); the setting found is restored after."""
    before = _FLAGS.fp32_precision
    _FLAGS.fp32_precision = "bf16" if onednn else "none"  # "bf16" only routes: callers check fp32
    try:
        yield
    finally:
        _FLAGS.fp32_precision = before


def mm(a: Tensor, b: Tensor) -> Tensor:
    """a (M, K) @ b (K, N): on the grid when it fits, else as it is."""
    n = b.size(1)
    if not _fits(a, b, n):
        calls["as_is"] += 1
        return torch.mm(a, b, out=a.new_empty(a.size(0), n))
    calls["grid"] += 1
    m, k = grid(a.size(0)), grid(a.size(1))
    out = a.new_empty(m, n)
    with flag(True):
        torch.mm(_pad(a, m, k), _pad(b, k, n), out=out)
    return out[:a.size(0)]


def addmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """beta * bias + alpha * a (M, K) @ b (K, N), bias (N,): on the grid when it fits."""
    n = b.size(1)
    if bias.dim() != 1 or bias.dtype != a.dtype or not _fits(a, b, n):
        calls["as_is"] += 1
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty(a.size(0), n))
    calls["grid"] += 1
    m, k = grid(a.size(0)), grid(a.size(1))
    out = a.new_empty(m, n)
    with flag(True):
        torch.addmm(bias, _pad(a, m, k), _pad(b, k, n), beta=beta, alpha=alpha, out=out)
    return out[:a.size(0)]


@contextlib.contextmanager
def accepting(dtypes: tuple[torch.dtype, ...]) -> Iterator[None]:
    """Inside the block, :func:`mm`/:func:`addmm` put products of ``dtypes`` on the grid
    (fp32 only outside any block); the setting found is restored after."""
    global _accepted
    before, _accepted = _accepted, tuple(dtypes)
    try:
        yield
    finally:
        _accepted = before


@contextlib.contextmanager
def on_grid(dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> Iterator[None]:
    """Inside the block, every CPU ``mm``/``addmm`` of this process goes through
    :func:`mm`/:func:`addmm`, which put products of ``dtypes`` on the grid; torch's
    kernels are back when it ends, also on an error."""
    if _FLAGS is None:
        raise RuntimeError("this torch has no oneDNN fp32 matmul route")
    # torch's scoped registration (a Library destroyed at exit restores the kernels it
    # shadowed). It is private: tests check the hand-back on the torch `make install` pins
    with torch.library._scoped_library("aten", "IMPL") as lib:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Overriding a previously registered kernel"
            lib.impl("mm", mm, "CPU")
            lib.impl("addmm", addmm, "CPU")
        with accepting(dtypes):
            yield
