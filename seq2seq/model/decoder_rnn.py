"""The decoder's RNN: one step at a time, fused over a sequence, or in a teacher-forced loop.

``StackedRNN`` holds the parameters (one nn.GRU/nn.LSTM) and runs them one step at a time
(decoding) or over a whole sequence in one call (when the inputs are known in advance).

In a teacher-forced step loop, ``StackedRNN.step`` would call torch's cell kernels
(``torch.gru_cell``/``lstm_cell``), which are chains of small ops: two products and about
a dozen pointwise ops per layer and step, each with its own autograd node, and, in the
backward, one thin product per weight and step added into that weight's gradient. In training the loop runs tens of steps per
batch, so these per-step costs add up (docs/performance.md#the-decoder-rnn-in-the-step-loop).
:class:`LoopRNN` computes the same function with the same parameters, and:

- the embeddings' share of layer 0's input product, W_e emb_t + b, for all steps in one
  product before the loop (the embeddings are known in advance; only the context and
  the fed-back vector are not);
- every weight's gradient formed once after the loop (``LoopLinear``,
  seq2seq/model/deferred.py);
- a GRU's gates as one autograd node with a written-out backward
  (seq2seq/model/gru_gates.py).

Tested equal to the plain step loop, values and gradients (tests/test_model.py,
tests/test_decoder_rnn.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.model import bf16_gemm
from seq2seq.model.deferred import LoopLinear, packed_positions
from seq2seq.model.dropout import dropout
from seq2seq.model.encoder import rnn_class
from seq2seq.model.gru_gates import gru_gates


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

    def step(self, x: Tensor, hidden: tuple[Tensor, ...], cell: tuple[Tensor, ...] | None
             ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        """x (B, input_size), per-layer (B, H) states -> the next per-layer states."""
        new_h, new_c = [], []
        for layer in range(self.layers):
            if layer > 0 and self.dropout:
                x = dropout(x, self.dropout, self.training)
            if self.is_lstm:
                h, c = self._cell(x, (hidden[layer], cell[layer]), *self._weights(layer))
                new_c.append(c)
            else:
                h = self._cell(x, hidden[layer], *self._weights(layer))
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


def _lstm_gates(gi: Tensor, gh: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """torch's LSTM cell from its products gi, gh (B, 4H) and the cell c (B, H) -> h', c'."""
    i, f, g, o = (gi + gh).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class LoopRNN:
    """A StackedRNN's steps for one loop over the embeddings ``emb`` (Σ rows, E), packed
    time-major (:func:`pack_steps`).

    The embeddings are layer 0's first E input features (the decoder puts them first);
    each ``step`` is given the step's other input parts (context, fed-back vector). The
    loop may run fewer rows step by step (the packed loop), never more.
    """

    def __init__(self, rnn: StackedRNN, emb: Tensor, rows: list[int]) -> None:
        """emb (Σ rows, E); rows (T,): how many rows step t runs (non-increasing)."""
        self.rnn = rnn
        width = emb.size(1)
        w_ih, _, b_ih, _ = rnn._weights(0)
        if w_ih.size(1) <= width:
            raise ValueError("LoopRNN: layer 0 reads only the embeddings; such a decoder "
                             "runs the RNN fused, not in a step loop")
        # every step's embedding rows, packed time-major, through W_e in one product
        emb_part = bf16_gemm.linear(emb, w_ih[:, :width], b_ih)
        self._inputs = [LoopLinear(w_ih[:, width:], rows, base=emb_part)]
        self._recurrent = []
        for layer in range(rnn.layers):
            w_ih, w_hh, b_ih, b_hh = rnn._weights(layer)
            if layer > 0:
                self._inputs.append(LoopLinear(w_ih, rows, bias=b_ih))
            self._recurrent.append(LoopLinear(w_hh, rows, bias=b_hh))

    def step(self, rest: list[Tensor], hidden: tuple[Tensor, ...],
             cell: tuple[Tensor, ...] | None
             ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        """rest: layer 0's input parts after the embedding, each (rows, d) -> the next
        per-layer states (rows, H), as ``StackedRNN.step`` on [emb; rest]."""
        x = torch.cat(rest, dim=-1) if len(rest) > 1 else rest[0]
        new_h, new_c = [], []
        for layer in range(self.rnn.layers):
            if layer > 0:
                x = new_h[-1]
                if self.rnn.dropout:
                    x = dropout(x, self.rnn.dropout, self.rnn.training)
            gi = self._inputs[layer](x)
            gh = self._recurrent[layer](hidden[layer])
            if self.rnn.is_lstm:
                h, c = _lstm_gates(gi, gh, cell[layer])  # type: ignore[index]
                new_c.append(c)
            else:
                h = gru_gates(gi, gh, hidden[layer])
            new_h.append(h)
        return tuple(new_h), (tuple(new_c) if self.rnn.is_lstm else None)


def pack_steps(x: Tensor, rows: list[int]) -> Tensor:
    """x (B, T, E) -> the first rows[t] rows of each step t, time-major (Σ rows, E), in one
    gather (its backward is one scatter, not T zero-filled (B, T, E) blocks)."""
    positions = packed_positions(rows, x.size(0), x.device)
    return x.reshape(-1, x.size(2)).index_select(0, positions)
