"""The fast Seq2Seq model: encoder + one decoder + a pluggable attention.

It computes what :mod:`seq2seq.model.reference` computes (tests check equality in
float64), with the speed-ups of docs/performance.md. Build it with
:func:`seq2seq.model.build_model`.

Search and training talk to the model only through ``encode``, ``init_state`` and
``step`` (plus the teacher-forced ``forward``); the Memory and DecoderState they pass
around reorder themselves with ``index_select``, so beam search never needs to know
the RNN type or the attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from seq2seq.errors import DataError
from seq2seq.model.attention import Attention, AttentionMemory
from seq2seq.model.decoder import Decoder, DecoderState
from seq2seq.model.encoder import Encoder

__all__ = ["DecoderState", "Memory", "Seq2Seq"]


@dataclass
class Memory:
    """Everything the decoder needs from the encoder, for one batch.

    final: (B, enc_size) [fwd h_S ; bwd h_1] of the encoder's top layer (for the bridge).
    attn: what the attention precomputed from the encoder states and source mask
    (projected keys, mask bias, fixed context).
    """

    final: Tensor
    attn: AttentionMemory

    def index_select(self, index: Tensor) -> Memory:
        """Rows ``index`` (new_batch,) of every field: beam search drops finished sentences."""
        return Memory(final=self.final.index_select(0, index), attn=self.attn.index_select(index))

    def repeat_rows(self, k: int) -> Memory:
        """Each row ``k`` times, consecutive (beam search's hypotheses of one sentence).
        ``final`` (which the bridge reads once) is copied; the attention's memory is
        shared by each group (AttentionMemory.repeat_rows)."""
        return Memory(final=self.final.repeat_interleave(k, dim=0), attn=self.attn.repeat_rows(k))


def _check_batch(src: Tensor, src_lens: Tensor) -> None:
    """Refuse malformed batches with a clear message instead of a shape error deep inside."""
    if src.dim() != 2 or src_lens.dim() != 1 or src_lens.size(0) != src.size(0):
        raise DataError(f"bad batch: src must be (B, S) and src_lens (B,), got "
                        f"{tuple(src.shape)} and {tuple(src_lens.shape)}")
    if src.size(0) == 0 or src.size(1) == 0 or int(src_lens.min()) < 1:
        raise DataError("bad batch: every source sentence needs at least one token "
                        "(drop empty lines before encoding)")
    if int(src_lens.max()) > src.size(1):
        raise DataError(f"bad batch: a source length {int(src_lens.max())} exceeds the "
                        f"padded width {src.size(1)}")


class Seq2Seq(nn.Module):
    """RNN encoder-decoder with attention ``none``, ``bahdanau`` or ``luong``."""

    def __init__(self, encoder: Encoder, decoder: Decoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @property
    def attention(self) -> Attention:
        return self.decoder.attention

    def encode(self, src: Tensor, src_lens: Tensor) -> Memory:
        """src (B, S) long padded with PAD_ID, src_lens (B,) long -> Memory."""
        _check_batch(src, src_lens)
        lengths = src_lens.to(src.device)
        mask = _length_mask(lengths, src.size(1))
        states, final = self.encoder(src, lengths, mask)
        attn = self.decoder.attention.init(states, mask)
        device = src.device.type
        if not torch.is_grad_enabled() and torch.is_autocast_enabled(device):
            # decoding under autocast: every step's context bmm would cast the values again
            attn = replace(attn, values=attn.values.to(torch.get_autocast_dtype(device)))
        return Memory(final, attn)

    def init_state(self, memory: Memory) -> DecoderState:
        """The decoder's initial state from the encoder through the learned bridge."""
        return self.decoder.init_state(memory.final)

    def step(self, y_prev: Tensor, state: DecoderState, memory: Memory
             ) -> tuple[Tensor, DecoderState, Tensor]:
        """y_prev (B,) long -> logits (B, V), new state, attention weights (B, S)."""
        return self.decoder.step(y_prev, state, memory.attn)

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor,
                teacher_forcing: float = 1.0, return_attention: bool = False,
                targets: Tensor | None = None,
                label_smoothing: float = 0.0) -> Tensor | tuple[Tensor, Tensor]:
        """Teacher-forced (or scheduled-sampling) decoding of a batch.

        src (B, S), src_lens (B,), tgt_in (B, T) = BOS + target, padded.
        Returns logits (B, T, V); with return_attention also weights (B, T, S).
        targets (B, T) = target + EOS, padded: return instead the summed cross-entropy
        over its real tokens (0-dim fp32), with the output layer fused into the loss.
        (Training goes through forward so that DistributedDataParallel sees the call.)
        """
        if tgt_in.dim() != 2 or tgt_in.size(0) != src.size(0) or tgt_in.size(1) == 0:
            raise DataError(f"bad batch: tgt_in must be (B, T) with B={src.size(0)} and T > 0, "
                            f"got {tuple(tgt_in.shape)}")
        memory = self.encode(src, src_lens)
        if targets is not None:
            if targets.shape != tgt_in.shape:
                raise DataError(f"bad batch: targets {tuple(targets.shape)} and tgt_in "
                                f"{tuple(tgt_in.shape)} must have the same shape")
            return self.decoder.loss(tgt_in, targets, self.init_state(memory), memory.attn,
                                     label_smoothing, teacher_forcing)
        logits, weights = self.decoder(tgt_in, self.init_state(memory), memory.attn,
                                       teacher_forcing)
        return (logits, weights) if return_attention else logits

    def forward_with_attention(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor,
                               teacher_forcing: float = 1.0) -> tuple[Tensor, Tensor]:
        """Like forward, also returning the attention weights (B, T, S)."""
        return self.forward(src, src_lens, tgt_in, teacher_forcing, return_attention=True)


def _length_mask(lengths: Tensor, width: int) -> Tensor:
    """(B,) lengths -> (B, width) bool, True at positions < length."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
