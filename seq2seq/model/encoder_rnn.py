"""The encoder's GRU layer as one loop: both directions side by side, a written-out backward.

``nn.GRU`` on a CPU runs each direction as its own chain of per-step autograd nodes: a
product and about a dozen pointwise ops a step forward, twice that backward, and one
thin product per step added into the recurrent weight's gradient. Over ~40 source
steps and two directions that was about a quarter of a training step
(docs/performance.md#the-encoder-loop). :func:`gru_layer` computes the same function
with the same ``nn.GRU`` parameters:

- both directions' input products in one product over all positions, gathered into
  time-major order with the backward direction reversed within each sentence;
- per step, both directions' recurrent products in one ``baddbmm`` and their gates in
  one pass (seq2seq/model/gru_gates.py, the C kernels where timed faster);
- one autograd node for the whole recurrence (:class:`_GRUSequence`), whose backward
  walks the steps in reverse and forms each recurrent weight's gradient in one product
  after the walk.

Tested equal to ``nn.GRU``, values and gradients (tests/test_encoder_rnn.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq import native
from seq2seq.model import bf16_gemm
from seq2seq.model import gru_gates as gates


def reverse_index(lengths: Tensor, width: int) -> Tensor:
    """(B,) lengths -> (B, width) positions that reverse each row within its length.

    rev[b, i] = len_b - 1 - i for i < len_b, else i (padding stays in place); the
    map is its own inverse.
    """
    pos = torch.arange(width, device=lengths.device).unsqueeze(0)  # (1, W)
    flipped = lengths.unsqueeze(1) - 1 - pos
    return torch.where(flipped >= 0, flipped, pos)


class _GRUSequence(torch.autograd.Function):
    """gi (S, D, B, 3H): each direction's input products in its own time order;
    w_hh (D, 3H, H), b_hh (D, 3H) -> states (S, D, B, H), starting from h_0 = 0."""

    @staticmethod
    def forward(ctx, gi: Tensor, w_hh: Tensor, b_hh: Tensor, fast: bool) -> Tensor:
        steps, dirs, batch, width = gi.shape
        rows, hidden = dirs * batch, width // 3
        states = gi.new_zeros(steps + 1, dirs, batch, hidden)  # h_0, then h_1 .. h_S
        gh = gi.new_empty(steps, dirs, batch, width)
        keep = gi.new_empty(steps, rows, width)
        w_t, bias = w_hh.transpose(1, 2), b_hh.unsqueeze(1)
        for t in range(steps):
            torch.baddbmm(bias, states[t], w_t, out=gh[t])
            gates.forward(gi[t].view(rows, width), gh[t].view(rows, width),
                          states[t].view(rows, hidden), fast,
                          out=states[t + 1].view(rows, hidden), keep=keep[t])
        ctx.fast = fast
        ctx.bf16 = bf16_gemm.applies(gh.view(-1, width))  # train.precision=bf16_gemm
        ctx.save_for_backward(w_hh, states, gh, keep)
        return states[1:]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        w_hh, states, gh, keep = ctx.saved_tensors
        steps, dirs, batch, width = gh.shape
        rows, hidden = dirs * batch, width // 3
        grad_gi, grad_gh = torch.empty_like(gh), torch.empty_like(gh)
        carry = None  # the gradient reaching h_t from step t + 1
        for t in reversed(range(steps)):
            g = grad[t] if carry is None else grad[t] + carry
            _, _, direct = gates.backward(
                g.reshape(rows, hidden), keep[t], gh[t].view(rows, width),
                states[t].view(rows, hidden), ctx.fast,
                grad_gi[t].view(rows, width), grad_gh[t].view(rows, width))
            carry = torch.baddbmm(direct.view(dirs, batch, hidden), grad_gh[t], w_hh)
        if ctx.bf16:
            grad_w, grad_b = _weight_grads_bf16(grad_gh, states[:-1], ctx.needs_input_grad)
            return grad_gi, grad_w, grad_b, None
        # Σ over steps and rows, one product per direction (direction-major copies: a sum
        # over the strided (steps, rows) dims directly was ~4x slower than over a copy)
        g_all = grad_gh.transpose(0, 1).reshape(dirs, steps * batch, width)
        h_all = states[:-1].transpose(0, 1).reshape(dirs, steps * batch, hidden)
        grad_w = torch.bmm(g_all.transpose(1, 2), h_all) if ctx.needs_input_grad[1] else None
        grad_b = g_all.sum(1) if ctx.needs_input_grad[2] else None
        return grad_gi, grad_w, grad_b, None


def _weight_grads_bf16(grad_gh: Tensor, h: Tensor, needs: tuple[bool, ...]
                       ) -> tuple[Tensor | None, Tensor | None]:
    """_GRUSequence's weight_hh and bias_hh gradients under train.precision=bf16_gemm:
    grad_gh (S, D, B, 3H), h (S, D, B, H) -> Σ over steps and rows of grad_ghᵀ h in one
    bf16 product per direction (rows padded, seq2seq/model/bf16_gemm.py), and of grad_gh
    in fp32."""
    grad_w = grad_b = None
    if needs[1]:
        grad_w = bf16_gemm.batched_weight_grad(grad_gh.transpose(0, 1), h.transpose(0, 1))
    if needs[2]:  # the leading dim first: a sum over contiguous blocks
        grad_b = grad_gh.sum(0).sum(1)
    return grad_w, grad_b


class Positions:
    """Where each (step, direction, row) of the loop reads and writes, for one batch.

    Direction 0 reads position t at step t; direction 1 reads each sentence reversed
    within its length (``rev``, its own inverse), so padding stays last in both and
    never reaches a state at a real token. Shared by all layers of one batch.
    """

    def __init__(self, lengths: Tensor, width: int, dirs: int, rev: Tensor | None) -> None:
        """lengths (B,) long; rev (B, S) from encoder.reverse_index (dirs == 2)."""
        batch, device = lengths.numel(), lengths.device
        pos = torch.arange(width, device=device).expand(batch, width)
        src = torch.stack([pos, rev] if dirs == 2 else [pos])  # (D, B, S): position at step t
        d = torch.arange(dirs, device=device).view(dirs, 1, 1)
        b = torch.arange(batch, device=device).view(1, batch, 1)
        # input rows (b, s, d) of the (B, S, D*3H) projection, ordered (step, dir, row)
        self.read = ((b * width + src) * dirs + d).permute(2, 0, 1).reshape(-1)
        # loop rows (t, d, b) for the output (B, S, D): the same map, as rev is its own inverse
        self.write = ((src * dirs + d) * batch + b).permute(1, 2, 0).reshape(-1)
        # both maps are permutations: their backward is a gather by the inverse
        self.read_back, self.write_back = _inverse(self.read), _inverse(self.write)
        last = (lengths - 1).view(batch, 1)  # both directions end at step len - 1
        self.last = ((last * dirs + d.view(1, dirs)) * batch + b.view(batch, 1)).reshape(-1)
        self.shape = (width, dirs, batch)


def _inverse(perm: Tensor) -> Tensor:
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return inverse


class _Permute(torch.autograd.Function):
    """x (N, ...) -> x[index] for a permutation ``index``; the backward gathers by the
    ``inverse`` instead of index_select's zero-fill and scatter-add."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor) -> Tensor:
        ctx.inverse = inverse
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad.index_select(0, ctx.inverse), None, None


def gru_layer(x: Tensor, where: Positions, rnns: list[nn.GRU], fast: bool
              ) -> tuple[Tensor, Tensor]:
    """One bidirectional (or forward-only) GRU layer: x (B, S, E) -> states (B, S, D*H),
    each direction's in source order, and finals (B, D*H): each direction's state at its
    last step (forward: the last token; backward: the first)."""
    width, dirs, batch = where.shape
    hidden = rnns[0].hidden_size
    w_ih = torch.cat([r.weight_ih_l0 for r in rnns]) if dirs > 1 else rnns[0].weight_ih_l0
    b_ih = torch.cat([r.bias_ih_l0 for r in rnns]) if dirs > 1 else rnns[0].bias_ih_l0
    proj = bf16_gemm.linear(x, w_ih, b_ih).view(-1, 3 * hidden)  # rows (b, s, d)
    gi = _Permute.apply(proj, where.read, where.read_back).view(width, dirs, batch, 3 * hidden)
    w_hh = torch.stack([r.weight_hh_l0 for r in rnns])
    b_hh = torch.stack([r.bias_hh_l0 for r in rnns])
    states = _GRUSequence.apply(gi, w_hh, b_hh, fast).reshape(-1, hidden)
    out = _Permute.apply(states, where.write, where.write_back).view(batch, width, dirs * hidden)
    return out, states.index_select(0, where.last).view(batch, dirs * hidden)


# The loop must time this much faster than nn.GRU: the two round differently, so a choice
# that flips between runs on a near tie changes a seed's last bits. The timing is per
# layer size: a tiny test model and a 256-unit one are different problems
# (docs/performance.md#the-encoder-loop)
LOOP_MARGIN = 1.05


def applies(x: Tensor, rnns: list[nn.RNNBase]) -> bool:
    """Whether :func:`gru_layer` runs these layers: one-layer GRUs with biases, a CPU
    tensor outside autocast, and the loop timed LOOP_MARGIN times faster than ``nn.GRU``
    here, at these layers' sizes."""
    if x.device.type != "cpu" or torch.is_autocast_enabled("cpu") or not all(
            isinstance(r, nn.GRU) and r.num_layers == 1 and r.bias and not r.bidirectional
            for r in rnns):
        return False
    sizes = (rnns[0].input_size, rnns[0].hidden_size, len(rnns))
    name = "encoder GRU loop {}->{} x{}".format(*sizes)
    return native.choose(name, lambda: _loop_trial(*sizes), margin=LOOP_MARGIN)


def _loop_trial(inputs: int, hidden: int, dirs: int
                ) -> tuple[Callable[[], object], Callable[[], object]]:
    """native.choose's problem: a GRU layer of these sizes over 64 sentences of 30 tokens,
    forward and backward, as nn.GRU calls and as the loop."""
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):  # the run's RNG stream stays untouched
        rnns = [nn.GRU(inputs, hidden, batch_first=True) for _ in range(dirs)]
    x = torch.randn(64, 30, inputs, generator=gen).requires_grad_()
    lengths = torch.randint(10, 31, (64,), generator=gen)
    lengths[0] = 30
    rev = reverse_index(lengths, 30)
    where = Positions(lengths, 30, dirs, rev if dirs == 2 else None)
    params = [x, *(p for r in rnns for p in r.parameters())]

    def torch_gru() -> object:
        with torch.enable_grad():
            outs = [rnns[0](x)[0]]
            if dirs == 2:
                outs.append(rnns[1](x.gather(1, rev.unsqueeze(-1).expand_as(x)))[0])
            return torch.autograd.grad(torch.cat(outs, -1).sum(), params)

    def loop() -> object:
        with torch.enable_grad():
            out, _ = gru_layer(x, where, rnns, gates.use_kernels(x))
            return torch.autograd.grad(out.sum(), params)
    return torch_gru, loop
