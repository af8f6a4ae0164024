"""Embeddings + a multi-layer (bidirectional) GRU/LSTM that ignores padding exactly.

Why not ``pack_padded_sequence``: on CPU the packed RNN backward re-allocates and
zero-fills the whole input-projection gradient at every time step, which made it much
slower than the padded call and a large cost of a training step
(docs/performance.md#fused-rnn-call-and-the-unpacked-encoder). Padding after the last
token never reaches a forward state at a real token, so the forward direction runs on
the padded batch as is; the backward direction runs on each sentence reversed within its
own length (padding still last) and is reversed back. Every state at a real token is
therefore the same as in a packed run, independent of padding and of batch companions.

A GRU layer on the CPU runs as one loop over both directions
(seq2seq/model/encoder_rnn.py) where a timing at first use finds it faster than the two
``nn.GRU`` calls; both read the same ``nn.GRU`` parameters, so checkpoints do not care.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.constants import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.model import encoder_rnn
from seq2seq.model import gru_gates as gates
from seq2seq.model.dropout import Dropout
from seq2seq.model.encoder_rnn import reverse_index

RNN_TYPES: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}


def rnn_class(rnn_type: str) -> type[nn.RNNBase]:
    """nn.GRU or nn.LSTM for ``model.rnn_type``; ConfigError for anything else."""
    if rnn_type not in RNN_TYPES:
        raise ConfigError(f"model.rnn_type={rnn_type!r}: use one of {', '.join(RNN_TYPES)}")
    return RNN_TYPES[rnn_type]


class Encoder(nn.Module):
    """Source embeddings and ``layers`` layers of forward (+ backward) RNNs."""

    def __init__(self, vocab_size: int, emb_size: int, hidden_size: int, layers: int = 1,
                 rnn_type: str = "gru", dropout: float = 0.0, bidirectional: bool = True) -> None:
        super().__init__()
        rnn = rnn_class(rnn_type)
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=PAD_ID)
        self.dropout = Dropout(dropout)
        self.directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.directions
        sizes = [emb_size] + [self.output_size] * (layers - 1)
        self.fwd = nn.ModuleList(rnn(n, hidden_size, batch_first=True) for n in sizes)
        self.bwd = (nn.ModuleList(rnn(n, hidden_size, batch_first=True) for n in sizes)
                    if bidirectional else None)

    def forward(self, src: Tensor, src_lens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Encode a padded batch.

        src: (B, S) long padded with PAD_ID; src_lens: (B,) long, each >= 1, on
        src's device; mask: (B, S) bool, True = real token.
        Returns states (B, S, dirs*H), zeros at padding, and final (B, dirs*H) =
        [fwd h_S ; bwd h_1] of the top layer (for an LSTM, its hidden states).
        """
        x = self.dropout(self.embedding(src))  # (B, S, E)
        rev = reverse_index(src_lens, src.size(1)) if self.bwd is not None else None
        where = None  # the loop's positions, made once for every layer that runs the loop
        for layer in range(len(self.fwd)):
            if layer > 0:
                x = self.dropout(x)
            rnns = self._layer(layer)
            if encoder_rnn.applies(x, rnns):  # timed per layer: their input sizes differ
                where = where or encoder_rnn.Positions(src_lens, src.size(1),
                                                       self.directions, rev)
                states, final = encoder_rnn.gru_layer(x, where, rnns, gates.use_kernels(x))
            else:
                states, final = self._torch_layer(x, layer, src_lens, rev)
            # zero the padding so no later layer or reader sees states computed on it
            x = states * mask.unsqueeze(-1)
        return x, final

    def _layer(self, layer: int) -> list[nn.RNNBase]:
        return [self.fwd[layer]] + ([self.bwd[layer]] if self.bwd is not None else [])

    def _torch_layer(self, x: Tensor, layer: int, src_lens: Tensor, rev: Tensor | None
                     ) -> tuple[Tensor, Tensor]:
        """One layer through nn.GRU/nn.LSTM, a call per direction: x (B, S, E) ->
        states (B, S, dirs*H), finals (B, dirs*H), as encoder_rnn.gru_layer."""
        last = (src_lens - 1).view(-1, 1, 1)  # each sentence's last real position
        out, _ = self.fwd[layer](x)  # (B, S, H)
        parts = [out]
        finals = [out.gather(1, last.expand(-1, 1, out.size(-1)))]
        if self.bwd is not None:
            rev = rev.unsqueeze(-1)  # type: ignore[union-attr]
            back, _ = self.bwd[layer](x.gather(1, rev.expand_as(x)))
            finals.append(back.gather(1, last.expand(-1, 1, back.size(-1))))
            parts.append(back.gather(1, rev.expand_as(back)))
        return torch.cat(parts, dim=-1), torch.cat(finals, dim=-1).squeeze(1)
