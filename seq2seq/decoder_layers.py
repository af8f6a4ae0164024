"""The decoder's layers: the stacked RNN, the readout, and what a teacher-forced loop
precomputes for all its steps (``LoopPlan``).

Used by seq2seq/decoder.py; the plan is why the step loop is cheaper than T calls of
``Decoder.step`` (tests/test_model.py checks that both compute the same function).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.dropout import dropout
from seq2seq.encoder import rnn_class


@dataclass
class StepTerms:
    """One loop step's share of ``LoopPlan``: rnn = (W_ih[:, :E] emb_t + b_ih (B, gates),
    W_ih[:, E:]); readout = W_e emb_t + b (B, R) or b (R,), or None when not folded."""

    rnn: tuple[Tensor, Tensor]
    readout: Tensor | None
    w_state: Tensor | None


@dataclass
class LoopPlan:
    """What a teacher-forced loop computes once for all steps instead of in each step.

    The first RNN layer's input is [emb; rest]: its emb part is one (B·T, E) x (E, gates)
    matmul before the loop, so each step multiplies only the rest (context or fed
    vector) and concatenates nothing. When the context feeds only the readout (query
    after the RNN, readout inside the loop: Luong with input feeding), the readout is
    linear in c_t = Σ_j α_tj h_j, so the values are projected through the readout's
    context block once, W_c h_j (B, S, R), and each step's context is already W_c c_t:
    the per-step context and readout matmuls read R instead of 2H (+ H) columns.

    rnn: (B, T, gates) per step (unbound) and W_ih[:, E:]; readout: W_e emb_t + b per
    step, or b alone without a deep output, or None when not folded; w_state: the
    readout's block for s_t.
    """

    rnn: tuple[Tensor, ...]
    w_rest: Tensor
    readout: tuple[Tensor, ...] | Tensor | None = None
    w_state: Tensor | None = None

    def at(self, step: int, rows: int) -> StepTerms:
        """The terms of step ``step`` for its first ``rows`` rows."""
        readout = self.readout
        if isinstance(readout, tuple):
            readout = readout[step][:rows]
        return StepTerms((self.rnn[step][:rows], self.w_rest), readout, self.w_state)


class StackedRNN(nn.Module):
    """A unidirectional multi-layer GRU/LSTM usable one step at a time or fused.

    The parameters belong to one nn.GRU/nn.LSTM; ``step`` applies the same weights
    with torch's cell kernels (what nn.GRUCell/nn.LSTMCell call), so the fused and
    per-step paths compute the same function.
    """

    def __init__(self, rnn_type: str, input_size: int, hidden_size: int, layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.rnn = rnn_class(rnn_type)(input_size, hidden_size, num_layers=layers,
                                       batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.is_lstm = rnn_type == "lstm"
        self.layers = layers
        self.dropout = dropout if layers > 1 else 0.0
        self._cell = torch.lstm_cell if self.is_lstm else torch.gru_cell

    def _weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r = self.rnn
        return (getattr(r, f"weight_ih_l{layer}"), getattr(r, f"weight_hh_l{layer}"),
                getattr(r, f"bias_ih_l{layer}"), getattr(r, f"bias_hh_l{layer}"))

    def split_input(self, lead: Tensor) -> tuple[Tensor, Tensor]:
        """For a first-layer input [lead; rest] whose lead is known for every step:
        lead (B, T, L) -> W_ih[:, :L] lead + b_ih (B, T, gates) in one matmul, and
        W_ih[:, L:] (gates, input_size - L), the weight each step applies to its rest."""
        w_ih, _, b_ih, _ = self._weights(0)
        width = lead.size(-1)
        return F.linear(lead, w_ih[:, :width], b_ih), w_ih[:, width:]

    def step(self, x: Tensor, hidden: tuple[Tensor, ...], cell: tuple[Tensor, ...] | None,
             lead: tuple[Tensor, Tensor] | None = None
             ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        """x (B, input_size), per-layer (B, H) states -> the next per-layer states.

        lead: this step's (W_ih[:, :L] lead_t + b_ih (B, gates), W_ih[:, L:]) from
        ``split_input``; x is then only the rest (B, input_size - L) of the input.
        """
        new_h, new_c = [], []
        for layer in range(self.layers):
            if layer > 0 and self.dropout:
                x = dropout(x, self.dropout, self.training)
            w_ih, w_hh, b_ih, b_hh = self._weights(layer)
            if layer == 0 and lead is not None:
                # the cells compute x W_ihᵀ + b_ih with addmm, which takes a (B, gates) bias
                b_ih, w_ih = lead
            if self.is_lstm:
                h, c = self._cell(x, (hidden[layer], cell[layer]), w_ih, w_hh, b_ih, b_hh)
                new_c.append(c)
            else:
                h = self._cell(x, hidden[layer], w_ih, w_hh, b_ih, b_hh)
            new_h.append(h)
            x = h
        return tuple(new_h), (tuple(new_c) if self.is_lstm else None)

    def fused(self, x: Tensor, hidden: tuple[Tensor, ...], cell: tuple[Tensor, ...] | None
              ) -> Tensor:
        """x (B, T, input_size) -> top-layer outputs (B, T, H) in one RNN call."""
        h0 = torch.stack(hidden)  # (layers, B, H)
        if self.is_lstm:
            out, _ = self.rnn(x, (h0, torch.stack(cell)))
        else:
            out, _ = self.rnn(x, h0)
        return out


class Readout(nn.Module):
    """t = tanh(W [s; c (; emb)]) or maxout over pairs of units (Goodfellow et al. 2013)."""

    def __init__(self, in_size: int, out_size: int, maxout: bool) -> None:
        super().__init__()
        self.maxout = maxout
        self.proj = nn.Linear(in_size, out_size * (2 if maxout else 1))

    def forward(self, parts: list[Tensor]) -> Tensor:
        """parts: tensors (..., d_i) -> (..., out_size)."""
        return self.activate(self.proj(torch.cat(parts, dim=-1)))

    def activate(self, z: Tensor) -> Tensor:
        """Pre-activations (..., out_size or 2·out_size for maxout) -> (..., out_size)."""
        if self.maxout:
            return z.unflatten(-1, (-1, 2)).amax(dim=-1)
        return torch.tanh(z)

    def from_projected(self, s: Tensor, context: Tensor, terms: StepTerms) -> Tensor:
        """The readout of a folded loop step: s (B, H), context already W_c c_t (B, R)."""
        return self.activate(torch.addmm(terms.readout, s, terms.w_state.t()) + context)

    def blocks(self, sizes: list[int]) -> tuple[Tensor, ...]:
        """W split by input part: the (proj_out, d_i) block that multiplies each part."""
        return self.proj.weight.split(sizes, dim=1)
