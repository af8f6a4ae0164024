"""Training loss: the output layer and the cross-entropy fused, chunk by chunk.

The output layer (readout H -> vocabulary V) and its softmax are the largest cost of a
training step on CPU (docs/performance.md#fused-output-layer-and-loss). Done the plain
way — logits (N, V), log_softmax, NLL, and their backward — the (N, V) matrix is written
and read about eight times (logits, log-probabilities, a zero-filled NLL gradient, the
log_softmax gradient). Here each chunk of rows goes logits -> softmax -> gradient while
it is still in cache, and the gradients of x, W and b are formed in the forward pass,
since the loss is a scalar sum whose backward only scales them (Liger-Kernel and "cut
cross-entropy" do the same on GPUs). No (N, V) tensor outlives a chunk.

Loss per token with label smoothing ε (as torch's ``cross_entropy``):
(1-ε)(lse - z_y) + ε(lse - mean_v z_v); gradient softmax(z) - (1-ε) onehot(y) - ε/V.

Inside :func:`bf16_products` (``train.precision=bf16_loss``, seq2seq.precision) an fp32
model's three products per chunk take bf16 inputs, as they do under autocast, while the
rest of the model stays fp32: the chunks' shapes recur all run, so oneDNN builds their
bf16 kernels once (docs/performance.md#bf16-for-the-output-layer-and-loss-only). The
softmax, the loss and the gradients' sums stay fp32, and grad x is returned in fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq import native
from seq2seq.model import gemm

# Rows per chunk: a (CHUNK_ROWS, 8000) fp32 block is 16 MB. Against 256 rows, 512 made
# fp32 training steps faster on an AMD CPU (the three products gain most from the larger
# M) and bf16 ones no slower; 1,024 gained nothing more
# (docs/performance.md#fused-output-layer-and-loss). A constant, not probed per machine:
# the chunk size sets the order of the loss's and grad W's sums, so a probe that flipped
# between runs would make two runs of one seed differ.
CHUNK_ROWS = 512

_bf16 = False  # set by bf16_products(): fp32 inputs' products in bf16


@contextlib.contextmanager
def bf16_products(enabled: bool = True) -> Iterator[None]:
    """Inside the block, the fused loss multiplies fp32 inputs in bf16 (fp32 accumulation
    and softmax); restores what it found."""
    global _bf16
    before, _bf16 = _bf16, enabled
    try:
        yield
    finally:
        _bf16 = before


def chunk_shapes(model: torch.nn.Module) -> tuple[gemm.Shape, ...] | None:
    """(M, K, N) of :func:`_chunked`'s products on a full chunk of ``model``'s output
    layer: logits x W^T, grad_logits x W, grad_logits^T x x. None for a model without
    the fused loss (the reference model)."""
    size = getattr(model.decoder, "output_size", None)
    if size is None:
        return None
    features, vocab = size
    return (CHUNK_ROWS, features, vocab), (CHUNK_ROWS, vocab, features), (vocab, CHUNK_ROWS, features)


def _wide(t: Tensor) -> Tensor:
    """bf16/fp16 -> fp32 for the softmax; fp32 and fp64 stay as they are."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _chunk_loss(logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """logits (n, V) fp32, target (n,) -> (summed loss, log-probabilities (n, V))."""
    logp = torch.log_softmax(logits, dim=1)
    loss = -logp.gather(1, target.unsqueeze(1)).sum()
    if smoothing:
        loss = (1.0 - smoothing) * loss - smoothing * logp.mean(dim=1).sum()
    return loss, logp


def _softmax_part(logits: Tensor, target: Tensor, smoothing: float,
                  grad_dtype: torch.dtype | None, grad_b: Tensor | None,
                  out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """One chunk's logits (n, V) -> its summed loss and, with ``grad_dtype``, the gradient
    of the logits softmax - (1-ε) onehot - ε/V in that dtype (also added to ``grad_b``;
    written into ``out``, (n, V) contiguous, when given; ``out`` may be ``logits`` itself).

    The fused C kernel (seq2seq/native) where it is built and timed faster: one read of
    the logits instead of the fp32 copy, log-softmax, exp and casts below.
    """
    if logits.device.type == "cpu" \
            and native.choose(f"cross_entropy_rows/{logits.dtype}", _loss_trial(logits.dtype)):
        fast = native.cross_entropy_rows(logits, target, smoothing, grad_dtype, grad_b, out)
        if fast is not None:
            return fast
    loss, grad = _torch_softmax_part(logits, target, smoothing, grad_dtype, grad_b)
    if out is not None and grad is not None:
        grad = out.copy_(grad)
    return loss, grad


def _torch_softmax_part(logits: Tensor, target: Tensor, smoothing: float,
                        grad_dtype: torch.dtype | None, grad_b: Tensor | None
                        ) -> tuple[Tensor, Tensor | None]:
    """_softmax_part in torch ops."""
    loss, logp = _chunk_loss(_wide(logits), target, smoothing)
    if grad_dtype is None:
        return loss, None
    probs = logp.exp_()  # softmax, in place
    probs[torch.arange(target.size(0), device=probs.device), target] -= 1.0 - smoothing
    if smoothing:
        probs.sub_(smoothing / probs.size(1))
    if grad_b is not None:
        grad_b += probs.sum(dim=0)
    return loss, probs.to(grad_dtype)


def _loss_trial(dtype: torch.dtype) -> Callable[[], tuple[Callable[[], object],
                                                           Callable[[], object]]]:
    """native.choose's problem: one full chunk of 8,000-word logits, with gradients."""
    def trial() -> tuple[Callable[[], object], Callable[[], object]]:
        gen = torch.Generator().manual_seed(0)  # the global RNG stream stays untouched
        logits = (4 * torch.randn(CHUNK_ROWS, 8000, generator=gen)).to(dtype)
        target = torch.randint(0, 8000, (CHUNK_ROWS,), generator=gen)
        bias = torch.zeros(8000)
        return (lambda: _torch_softmax_part(logits, target, 0.1, dtype, bias),
                lambda: native.cross_entropy_rows(logits, target, 0.1, dtype, bias))
    return trial


def _chunked(x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
             smoothing: float, with_grads: bool
             ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None] | None]:
    """The chunk loop: summed loss, and with_grads also (grad x, grad W, grad b) of it."""
    dtype = x.dtype  # bf16 under autocast: matmuls in bf16, softmax in fp32
    if _bf16 and dtype == torch.float32:
        dtype = torch.bfloat16
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    if with_grads and dtype in (torch.bfloat16, torch.float16):
        return _low_precision_with_grads(x, w, b, weight, bias, target, smoothing)
    total = _wide(x.new_zeros(()))
    grad_x = grad_w = grad_b = None
    if with_grads:
        grad_x = torch.empty_like(x)  # x's dtype: fp32 for an fp32 model in bf16_products()
        grad_w = torch.zeros_like(weight)
        grad_b = None if bias is None else torch.zeros_like(bias)
    xs = x.to(dtype)  # one cast of all rows, not one per chunk
    # with gradients (fp32/fp64 here: unpadded, contiguous, in dtype) every chunk's logits
    # go into this one block and their gradient over them, not into a fresh (CHUNK_ROWS, V)
    # block per chunk (docs/performance.md#fused-output-layer-and-loss)
    block = xs.new_empty(min(CHUNK_ROWS, xs.size(0)), w.size(0)) if with_grads else None
    for start in range(0, x.size(0), CHUNK_ROWS):
        xc, tc = xs[start:start + CHUNK_ROWS], target[start:start + CHUNK_ROWS]
        rows = xc.size(0)
        if rows < CHUNK_ROWS and dtype in (torch.bfloat16, torch.float16):
            # low-precision products go to oneDNN, which builds a kernel for every new
            # shape (~25 ms on machine E): the last chunk runs at the full chunk's shape
            # (no gradients here: with them, _low_precision_with_grads pads)
            xc = torch.cat([xc, xc.new_zeros(CHUNK_ROWS - rows, xc.size(1))])
        # full chunks are the only shapes that recur all run: worth a oneDNN kernel each
        with gemm.recurring() if xc.size(0) == CHUNK_ROWS else contextlib.nullcontext():
            logits = (F.linear(xc, w, b)[:rows] if block is None
                      else _linear_into(xc, w, b, block[:rows]))
            loss, g = _softmax_part(logits, tc, smoothing, dtype if with_grads else None,
                                    grad_b, logits if with_grads else None)
            total += loss
            if g is None:
                continue
            grad_x[start:start + CHUNK_ROWS] = torch.mm(g, w)[:rows]
            if dtype == grad_w.dtype:
                grad_w.addmm_(g.t(), xc)
            else:  # addmm_ wants one dtype; sum the bf16 product in fp32
                grad_w += torch.mm(g.t(), xc).to(grad_w.dtype)
    return total, ((grad_x, grad_w, grad_b) if with_grads else None)


def _linear_into(x: Tensor, w: Tensor, b: Tensor | None, out: Tensor) -> Tensor:
    """F.linear(x, w, b) written into ``out`` (rows, V): the same product (addmm/mm)."""
    if b is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(b, x, w.t(), out=out)


def _low_precision_with_grads(x: Tensor, w: Tensor, b: Tensor | None, weight: Tensor,
                              bias: Tensor | None, target: Tensor, smoothing: float
                              ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None]]:
    """The chunk loop with bf16/fp16 products (w, b: weight and bias cast) and gradients.

    Each chunk's logit gradient goes into its rows of one (N padded, V) buffer, and
    grad x and grad W are one product each after the loop: per chunk, grad W's bf16
    product would be cast to fp32 and added into an fp32 (V, H) sum, two passes over
    8 MB a chunk (docs/performance.md#the-loss-gradients-in-two-products). Rows are
    padded with zeros to whole chunks: oneDNN builds a kernel for every new shape."""
    n, chunks = x.size(0), -(-x.size(0) // CHUNK_ROWS)
    xs = x.to(w.dtype)  # one cast of all rows, not one per chunk
    if chunks * CHUNK_ROWS > n:
        xs = torch.cat([xs, xs.new_zeros(chunks * CHUNK_ROWS - n, xs.size(1))])
    grads = xs.new_empty(chunks * CHUNK_ROWS, w.size(0))
    grads[n:].zero_()  # padding rows add nothing to grad W
    grad_b = None if bias is None else torch.zeros_like(bias)
    total = _wide(x.new_zeros(()))
    for start in range(0, n, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, n - start)
        logits = F.linear(xs[start:start + CHUNK_ROWS], w, b)[:rows]
        loss, _ = _softmax_part(logits, target[start:start + rows], smoothing, w.dtype,
                                grad_b, grads[start:start + rows])
        total += loss
    grad_x = torch.mm(grads, w)[:n].to(x.dtype)  # fp32 for an fp32 model in bf16_products()
    grad_w = torch.mm(grads.t(), xs).to(weight.dtype)
    return total, (grad_x, grad_w, grad_b)


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of F.linear(x, weight, bias) with its gradients made in forward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                smoothing: float) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):  # dtypes are chosen in _chunked
            total, grads = _chunked(x, weight, bias, target, smoothing, with_grads=True)
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_x, grad_w, grad_b = ctx.saved_tensors
        return (grad_x * grad, grad_w * grad, None if grad_b is None else grad_b * grad,
                None, None)


def linear_cross_entropy(x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                         label_smoothing: float = 0.0) -> Tensor:
    """Summed cross-entropy of the logits ``F.linear(x, weight, bias)`` against ``target``.

    x (N, H) readout vectors of real target tokens (no padding), weight (V, H), bias (V,)
    or None, target (N,) long -> a 0-dim sum (fp32, or fp64 for fp64 inputs). Equal to
    ``F.cross_entropy(F.linear(x, weight, bias), target, reduction="sum",
    label_smoothing=...)`` with the same gradients, without an (N, V) tensor.
    """
    if x.size(0) == 0:
        return _wide(x.sum() + weight.sum() * 0)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(x, weight, bias, target, float(label_smoothing))
    return _chunked(x, weight, bias, target, float(label_smoothing), with_grads=False)[0]
