"""Embeddings + a multi-layer (bidirectional) GRU/LSTM that ignores padding exactly.

Why not ``pack_padded_sequence``: on CPU the packed RNN backward re-allocates and
zero-fills the whole input-projection gradient at every time step, which made it much
slower than the padded call and a large cost of a training step
(docs/performance.md#fused-rnn-call-and-the-unpacked-encoder). Padding after the last
token never reaches a forward state at a real token, so the forward direction runs on
the padded batch as is; the backward direction runs on each sentence reversed within its
own length (padding still last) and is reversed back. Every state at a real token is
therefore the same as in a packed run, independent of padding and of batch companions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.constants import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.model.dropout import Dropout

RNN_TYPES: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}


def rnn_class(rnn_type: str) -> type[nn.RNNBase]:
    """nn.GRU or nn.LSTM for ``model.rnn_type``; ConfigError for anything else."""
    if rnn_type not in RNN_TYPES:
        raise ConfigError(f"model.rnn_type={rnn_type!r}: use one of {', '.join(RNN_TYPES)}")
    return RNN_TYPES[rnn_type]


def reverse_index(lengths: Tensor, width: int) -> Tensor:
    """(B,) lengths -> (B, width) positions that reverse each row within its length.

    rev[b, i] = len_b - 1 - i for i < len_b, else i (padding stays in place); the
    map is its own inverse.
    """
    pos = torch.arange(width, device=lengths.device).unsqueeze(0)  # (1, W)
    flipped = lengths.unsqueeze(1) - 1 - pos
    return torch.where(flipped >= 0, flipped, pos)


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
        last = (src_lens - 1).view(-1, 1, 1)  # each sentence's last real position
        rev = reverse_index(src_lens, src.size(1)).unsqueeze(-1)  # (B, S, 1)
        for layer in range(len(self.fwd)):
            if layer > 0:
                x = self.dropout(x)
            out, _ = self.fwd[layer](x)  # (B, S, H)
            parts = [out]
            finals = [out.gather(1, last.expand(-1, 1, out.size(-1)))]
            if self.bwd is not None:
                back, _ = self.bwd[layer](x.gather(1, rev.expand_as(x)))
                finals.append(back.gather(1, last.expand(-1, 1, back.size(-1))))
                parts.append(back.gather(1, rev.expand_as(back)))
            # zero the padding so no later layer or reader sees states computed on it
            x = torch.cat(parts, dim=-1) * mask.unsqueeze(-1)
        return x, torch.cat(finals, dim=-1).squeeze(1)
