"""One decoder for every attention: a per-token ``step()`` and a teacher-forced forward.

What differs between attentions is read from the attention's flags (see
seq2seq/model/attention.py), never from its name. One step, with emb = E y_{t-1}:

    query_before_rnn:  c_t = att(s_{t-1});  s_t = RNN(s_{t-1}, [emb; c_t (; feed)])
    otherwise:         s_t = RNN(s_{t-1}, [emb (; feed)]);  c_t = att(s_t)
    readout            t_t = tanh(W_o [s_t; c_t (; emb)])   (maxout instead of tanh optional)
    logits             W_s t_t + b                          (W_s may be tied to E)

feed = t_{t-1} when the attention ``feeds_input`` (Luong's h~_{t-1}). The readout
reads emb when the attention asks for a deep output (Bahdanau, none) and the model
config allows it.

Speed: the teacher-forced forward runs the logits, and the readout unless input feeding
needs it at every step, once over all steps after the loop; when the RNN input does not
depend on the RNN output (no input feeding, and a query-free attention or a query taken
after the RNN) the RNN runs as one fused nn.GRU/nn.LSTM call and attention as one
batched matmul. In the step loop, the gradients of the encoder states (and Luong's keys)
are summed once after the loop (``Attention.loop_memory``, seq2seq/model/deferred.py),
as are the weights' of the RNN and of an input-feeding readout (``LoopRNN``,
``Readout.in_loop``), and in training each step runs only the sentences whose target has
not ended (``_packed_loop``; under CPU bf16 their count rounded up to a multiple of 16,
``row_grid``). Training calls ``loss``: the output layer and the cross-entropy fused in
chunks over real tokens only (seq2seq/model/loss.py), never an (N, V) logits tensor.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.constants import PAD_ID
from seq2seq.model import bf16_gemm
from seq2seq.model.attention import Attention, AttentionMemory
from seq2seq.model.decoder_rnn import LoopRNN, StackedRNN, pack_steps
from seq2seq.model.deferred import LoopLinear
from seq2seq.model.dropout import Dropout
from seq2seq.model.loss import linear_cross_entropy

ROW_GRID_BF16_CPU = 16  # step rows are rounded up to a multiple of this under CPU bf16


def row_grid(device_type: str) -> int:
    """How many rows a training step's row count is rounded up to (1: none).

    Under bf16 autocast on a CPU the step products go to oneDNN, which builds and caches
    a kernel for every new shape; the packed loop's row count falls step by step and
    differs from batch to batch, so without rounding it meets new shapes all the time
    (docs/performance.md#rows-on-a-grid-in-the-bf16-step-loop). The extra rows are
    sentences already ended, computed and dropped. fp32 products (MKL) build nothing
    per shape, so there the extra rows would be work for nothing.
    """
    if device_type == "cpu" and torch.is_autocast_enabled("cpu") \
            and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        return ROW_GRID_BF16_CPU
    return 1


@dataclass
class DecoderState:
    """The recurrent state between steps.

    hidden: one (B, H) tensor per layer (top layer last); cell: the same for an LSTM,
    else None; feed: (B, H) previous attentional vector for input feeding, else None.
    """

    hidden: tuple[Tensor, ...]
    cell: tuple[Tensor, ...] | None = None
    feed: Tensor | None = None

    def _map(self, fn: Callable[[Tensor], Tensor]) -> DecoderState:
        """Apply fn to every tensor (per-layer hidden and cell states, the feed)."""
        def each(ts: tuple[Tensor, ...] | None) -> tuple[Tensor, ...] | None:
            return None if ts is None else tuple(fn(t) for t in ts)

        return DecoderState(hidden=each(self.hidden), cell=each(self.cell),
                            feed=None if self.feed is None else fn(self.feed))

    def index_select(self, index: Tensor) -> DecoderState:
        """Rows ``index`` (new_batch,) of every tensor: beam search reorders with this."""
        return self._map(lambda t: t.index_select(0, index))

    def head(self, rows: int) -> DecoderState:
        """The first ``rows`` rows of every tensor (views)."""
        return self._map(lambda t: t[:rows])


class Readout(nn.Module):
    """t = tanh(W [s; c (; emb)]) or maxout over pairs of units (Goodfellow et al. 2013)."""

    def __init__(self, in_size: int, out_size: int, maxout: bool) -> None:
        super().__init__()
        self.maxout = maxout
        self.proj = nn.Linear(in_size, out_size * (2 if maxout else 1))

    def forward(self, parts: list[Tensor]) -> Tensor:
        """parts: tensors (..., d_i) -> (..., out_size)."""
        return self._activate(bf16_gemm.linear(torch.cat(parts, dim=-1), self.proj.weight,
                                               self.proj.bias))

    def in_loop(self, rows: list[int]) -> Callable[[list[Tensor]], Tensor]:
        """The same function for the steps of a loop that runs ``rows`` (T,) rows each
        (input feeding reads it at every step): each step's parts (rows_t, d_i) ->
        (rows_t, out_size), its weight's gradient formed once after the loop, not one
        thin product per step (seq2seq/model/deferred.py)."""
        proj = LoopLinear(self.proj.weight, rows, bias=self.proj.bias)
        return lambda parts: self._activate(proj(torch.cat(parts, dim=-1)))

    def _activate(self, z: Tensor) -> Tensor:
        if self.maxout:
            return z.unflatten(-1, (-1, 2)).amax(dim=-1)
        return torch.tanh(z)


class Decoder(nn.Module):
    """Target embeddings, bridge, stacked RNN, attention, readout and output layer."""

    def __init__(self, vocab_size: int, emb_size: int, hidden_size: int, attention: Attention,
                 enc_final_size: int, layers: int = 1, rnn_type: str = "gru",
                 dropout: float = 0.0, deep_output: bool = True, maxout: bool = False,
                 tie_embeddings: bool = False) -> None:
        super().__init__()
        self.attention = attention
        self.hidden_size = hidden_size
        self.layers = layers
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=PAD_ID)
        self.dropout = Dropout(dropout)
        att = attention
        rnn_in = emb_size + (att.context_size if att.query_before_rnn else 0)
        rnn_in += hidden_size if att.feeds_input else 0
        self.rnn = StackedRNN(rnn_type, rnn_in, hidden_size, layers, dropout)
        # learned bridge: encoder final states -> initial state of every decoder layer
        self.bridge = nn.Linear(enc_final_size, layers * hidden_size)
        self.bridge_cell = (nn.Linear(enc_final_size, layers * hidden_size)
                            if rnn_type == "lstm" else None)
        self.reads_embedding = att.output_reads_embedding and deep_output
        readout_in = hidden_size + att.context_size + (emb_size if self.reads_embedding else 0)
        self.readout = Readout(readout_in, hidden_size, maxout)
        self.tie_embeddings = tie_embeddings
        if tie_embeddings:
            # the output matrix is E itself, so project t to the embedding size if needed
            self.tie_proj = (nn.Linear(hidden_size, emb_size, bias=False)
                             if hidden_size != emb_size else None)
            self.out_bias = nn.Parameter(torch.zeros(vocab_size))
        else:
            self.output = nn.Linear(hidden_size, vocab_size)
        # rows per training step rounded up to a multiple of this; None: row_grid() decides
        self.row_grid: int | None = None

    @property
    def output_size(self) -> tuple[int, int]:
        """(input features, vocabulary) of the output layer: (H or E, V)."""
        weight = self.embedding.weight if self.tie_embeddings else self.output.weight
        return weight.size(1), weight.size(0)

    def step_shapes(self, rows: int) -> tuple[tuple[int, int, int], ...]:
        """(M, K, N) of the RNN's products in one step of ``rows`` rows: input and
        recurrent gates of every layer (what seq2seq.model.gemm's probe times)."""
        return tuple((rows, w.size(1), w.size(0)) for name, w in self.rnn.rnn.named_parameters()
                     if name.startswith("weight_"))

    @property
    def can_fuse(self) -> bool:
        """True when the RNN inputs of all steps are known before the RNN runs."""
        att = self.attention
        return not att.feeds_input and (att.query_free or not att.query_before_rnn)

    def init_state(self, final: Tensor) -> DecoderState:
        """Encoder final states (B, F) -> the initial DecoderState.

        An LSTM's initial cell comes from the same final states through its own
        linear map (the encoder exposes hidden states only).
        """
        def split(x: Tensor) -> tuple[Tensor, ...]:
            return tuple(x.view(x.size(0), self.layers, self.hidden_size).unbind(1))

        hidden = split(torch.tanh(self.bridge(final)))
        cell = None
        if self.bridge_cell is not None:
            cell = split(self.bridge_cell(final))
        feed = final.new_zeros(final.size(0), self.hidden_size) if self.attention.feeds_input else None
        return DecoderState(hidden, cell, feed)

    def logits(self, t: Tensor) -> Tensor:
        """Readout vectors (..., H) -> logits (..., V)."""
        x, weight, bias = self._output_layer(t)
        return F.linear(x, weight, bias)

    def _output_layer(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Readout vectors (..., H) -> the output layer's input (..., H or E), W (V, ·), b (V,)."""
        t = self.dropout(t)
        if not self.tie_embeddings:
            return t, self.output.weight, self.output.bias
        if self.tie_proj is not None:
            t = self.tie_proj(t)
        return t, self.embedding.weight, self.out_bias

    def _advance(self, emb: Tensor, state: DecoderState, memory: AttentionMemory,
                 loop: LoopRNN | None = None,
                 readout: Callable[[list[Tensor]], Tensor] | None = None
                 ) -> tuple[Tensor, Tensor, Tensor, DecoderState]:
        """One step without the output layer: emb (B, E) -> s_t (B, H), c_t (B, C),
        weights (B, S) and the new state (whose feed is t_t when input feeding).
        ``loop``, ``readout``: the RNN and the readout of a teacher-forced loop (the RNN
        has emb's product already; both defer their weights' gradients)."""
        att = self.attention
        rest = []
        if att.query_before_rnn:
            context, weights = att(state.hidden[-1], memory)
            rest.append(context)
        if att.feeds_input:
            rest.append(state.feed)
        if loop is None:
            hidden, cell = self.rnn.step(torch.cat([emb, *rest], dim=-1), state.hidden,
                                         state.cell)
        else:
            hidden, cell = loop.step(rest, state.hidden, state.cell)
        s = hidden[-1]
        if not att.query_before_rnn:
            context, weights = att(s, memory)
        feed = self._readout(s, emb, context, readout) if att.feeds_input else None
        return s, context, weights, DecoderState(hidden, cell, feed)

    def _readout(self, s: Tensor, emb: Tensor, context: Tensor,
                 readout: Callable[[list[Tensor]], Tensor] | None = None) -> Tensor:
        parts = [s, context, emb] if self.reads_embedding else [s, context]
        return (readout or self.readout)(parts)

    def step(self, y_prev: Tensor, state: DecoderState, memory: AttentionMemory
             ) -> tuple[Tensor, DecoderState, Tensor]:
        """y_prev (B,) long -> logits (B, V), new state, attention weights (B, S)."""
        emb = self.dropout(self.embedding(y_prev))
        s, context, weights, state = self._advance(emb, state, memory)
        t = state.feed if state.feed is not None else self._readout(s, emb, context)
        return self.logits(t), state, weights

    def forward(self, tgt_in: Tensor, state: DecoderState, memory: AttentionMemory,
                teacher_forcing: float = 1.0) -> tuple[Tensor, Tensor]:
        """tgt_in (B, T) = BOS + target -> logits (B, T, V), weights (B, T, S).

        teacher_forcing < 1: at each step each sentence feeds its own previous argmax
        with probability 1 - teacher_forcing (scheduled sampling), through step().
        """
        if teacher_forcing < 1.0:
            return self._sampled(tgt_in, state, memory, teacher_forcing)
        t, weights = self._readouts(tgt_in, state, memory)
        return self.logits(t), weights

    def loss(self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, memory: AttentionMemory,
             label_smoothing: float = 0.0, teacher_forcing: float = 1.0) -> Tensor:
        """Summed cross-entropy over the real tokens of tgt_out (B, T) (PAD_ID skipped).

        Teacher-forced, the output layer and the loss run fused in chunks
        (seq2seq/model/loss.py): no (tokens, V) logits tensor is built.
        """
        mask = tgt_out != PAD_ID
        if teacher_forcing < 1.0:
            logits, _ = self._sampled(tgt_in, state, memory, teacher_forcing)
            return F.cross_entropy(logits[mask].float(), tgt_out[mask], reduction="sum",
                                   label_smoothing=label_smoothing)
        if self.can_fuse:
            t, _ = self._readouts(tgt_in, state, memory)
            t, targets = t[mask], tgt_out[mask]
        else:
            t, targets = self._packed_loop(tgt_in, tgt_out, state, memory)
        x, weight, bias = self._output_layer(t)
        return linear_cross_entropy(x, weight, bias, targets, label_smoothing)

    def _packed_loop(self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState,
                     memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        """The step loop over real tokens only: readouts (N, H) and their targets (N,).

        Rows are sorted longest target first and each step runs only the rows whose
        target has not ended (as a packed RNN does), so no step computes on padding
        (docs/performance.md#packed-step-loop). Training batches
        arrive sorted (``batching.collate``); other orders are sorted here. Tokens
        come out time-major: step 0 of every row, then step 1, ...
        """
        mask = tgt_out != PAD_ID
        lengths = mask.sum(dim=1)
        if bool((lengths[:-1] < lengths[1:]).any()):
            order = torch.argsort(lengths, descending=True, stable=True)
            tgt_in, tgt_out, mask, lengths = tgt_in[order], tgt_out[order], mask[order], lengths[order]
            state, memory = state.index_select(order), memory.index_select(order)
        lens = lengths.tolist()
        steps = lens[0]
        # active[i]: rows whose target is longer than i (a prefix, lens descending)
        active = [len(lens) - bisect.bisect_right(lens[::-1], i) for i in range(steps)]
        emb = self.dropout(self.embedding(tgt_in[:, :steps]))
        grid = self.row_grid if self.row_grid is not None else row_grid(emb.device.type)
        computed = [min(len(lens), -(-a // grid) * grid) for a in active]
        t, _ = self._loop(emb, state, memory, computed, keep=active)
        return t, tgt_out[:, :steps].t()[mask[:, :steps].t()]

    def _readouts(self, tgt_in: Tensor, state: DecoderState, memory: AttentionMemory
                  ) -> tuple[Tensor, Tensor]:
        """Teacher-forced: tgt_in (B, T) -> readout vectors (B, T, H), weights (B, T, S)."""
        emb = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        if self.can_fuse:
            return self._fused(emb, state, memory)
        return self._loop(emb, state, memory)

    def _loop(self, emb: Tensor, state: DecoderState, memory: AttentionMemory,
              active: list[int] | None = None, keep: list[int] | None = None
              ) -> tuple[Tensor, Tensor]:
        """Step by step: emb (B, T, E) -> readout vectors (B, T, H), weights (B, T, S).

        active (T,) non-increasing: step i runs only the first active[i] rows (the
        others have finished); the results are then packed time-major, (N, H) and
        (N, S) with N = sum(keep), the first keep[i] <= active[i] rows of step i
        (default: all of them). Rows run past their target's end compute only what
        is then dropped, so they add nothing to the loss or its gradients.
        """
        states, contexts, weights, embs = [], [], [], []
        rows = emb.size(0)
        per_step = active if active is not None else [rows] * emb.size(1)
        memory = step_memory = self.attention.loop_memory(memory, per_step)
        # packed and split, not emb[:, i][:rows]: the backward of T slices would zero-fill
        # a (B, E) or (B, T, E) block each
        packed = pack_steps(emb, per_step)
        loop = LoopRNN(self.rnn, packed, per_step)
        readout = self.readout.in_loop(per_step) if self.attention.feeds_input else None
        for i, emb_i in enumerate(packed.split(per_step)):
            if per_step[i] < rows:
                rows = per_step[i]
                state, step_memory = state.head(rows), memory.head(rows)
            s, context, w, state = self._advance(emb_i, state, step_memory, loop, readout)
            out = state.feed if state.feed is not None else s
            parts = (out, context, w, emb_i)
            if keep is not None and keep[i] < rows:
                # only when rows run past their end: a slice node's backward zero-fills
                # and copies, even for a slice that keeps every row
                parts = tuple(x[: keep[i]] for x in parts)
            for kept, x in zip((states, contexts, weights, embs), parts, strict=True):
                kept.append(x)

        def join(parts: list[Tensor]) -> Tensor:
            return torch.cat(parts) if active is not None else torch.stack(parts, dim=1)

        if self.attention.feeds_input:  # the readout already ran inside the loop
            t = join(states)
        else:  # the readout of all steps at once
            t = self._readout(join(states), emb if active is None else join(embs), join(contexts))
        return t, join(weights)

    def _fused(self, emb: Tensor, state: DecoderState, memory: AttentionMemory
               ) -> tuple[Tensor, Tensor]:
        """The whole target in one RNN call (only when ``can_fuse``): readout vectors
        (B, T, H) and weights (B, T, S)."""
        att = self.attention
        if att.query_before_rnn:
            # a query-free attention reads only the query's shape: (B, T, H) asks for T steps
            placeholder = state.hidden[-1].unsqueeze(1).expand(-1, emb.size(1), -1)
            context, weights = att(placeholder, memory)
            out = self.rnn.fused(torch.cat([emb, context], dim=-1), state.hidden, state.cell)
        else:
            out = self.rnn.fused(emb, state.hidden, state.cell)  # (B, T, H)
            context, weights = att(out, memory)  # all steps in one batched matmul
        return self._readout(out, emb, context), weights

    def _sampled(self, tgt_in: Tensor, state: DecoderState, memory: AttentionMemory,
                 ratio: float) -> tuple[Tensor, Tensor]:
        """Scheduled sampling (Bengio et al. 2015) through step()."""
        logits, weights = [], []
        y = tgt_in[:, 0]
        for i in range(tgt_in.size(1)):
            if i > 0:
                own = logits[-1].detach().argmax(dim=-1)
                keep = torch.rand(y.shape, device=y.device) < ratio
                y = torch.where(keep, tgt_in[:, i], own)
            step_logits, state, w = self.step(y, state, memory)
            logits.append(step_logits)
            weights.append(w)
        return torch.stack(logits, dim=1), torch.stack(weights, dim=1)
