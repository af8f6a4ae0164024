"""The Seq2Seq model: encoder + one decoder + a pluggable attention, and build_model(cfg).

Search and training talk to the model only through ``encode``, ``init_state`` and
``step`` (plus the teacher-forced ``forward``); the Memory and DecoderState they pass
around reorder themselves with ``index_select``, so beam search never needs to know
the RNN type or the attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor, nn

from seq2seq.attention import ATTENTIONS, LUONG_SCORES, Attention, AttentionMemory, build_attention
from seq2seq.config import ModelConfig
from seq2seq.decoder import Decoder, DecoderState
from seq2seq.encoder import Encoder, rnn_class
from seq2seq.errors import ConfigError, DataError
from seq2seq.reference import ReferenceSeq2Seq

__all__ = ["DecoderState", "Memory", "Seq2Seq", "build_model", "count_parameters"]


@dataclass
class Memory:
    """Everything the decoder needs from the encoder, for one batch.

    states: (B, S, enc_size) encoder states (zeros at padding).
    mask: (B, S) bool, True = real token.  lengths: (B,) long source lengths.
    final: (B, enc_size) [fwd h_S ; bwd h_1] of the encoder's top layer.
    attn: what the attention precomputed (projected keys, mask bias, fixed context).
    """

    states: Tensor
    mask: Tensor
    lengths: Tensor
    final: Tensor
    attn: AttentionMemory

    def index_select(self, index: Tensor) -> Memory:
        """Rows ``index`` (new_batch,) of every field, e.g. to expand to beam size."""
        return Memory(
            states=self.states.index_select(0, index),
            mask=self.mask.index_select(0, index),
            lengths=self.lengths.index_select(0, index),
            final=self.final.index_select(0, index),
            attn=self.attn.index_select(index),
        )


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
        return Memory(states, mask, lengths, final, attn)

    def init_state(self, memory: Memory) -> DecoderState:
        """The decoder's initial state from the encoder through the learned bridge."""
        return self.decoder.init_state(memory.final)

    def step(self, y_prev: Tensor, state: DecoderState, memory: Memory
             ) -> tuple[Tensor, DecoderState, Tensor]:
        """y_prev (B,) long -> logits (B, V), new state, attention weights (B, S)."""
        return self.decoder.step(y_prev, state, memory.attn)

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor,
                teacher_forcing: float = 1.0, return_attention: bool = False,
                tgt_mask: Tensor | None = None, targets: Tensor | None = None,
                label_smoothing: float = 0.0) -> Tensor | tuple[Tensor, Tensor]:
        """Teacher-forced (or scheduled-sampling) decoding of a batch.

        src (B, S), src_lens (B,), tgt_in (B, T) = BOS + target, padded.
        Returns logits (B, T, V); with return_attention also weights (B, T, S).
        tgt_mask (B, T) bool, optional: logits only at its True positions, (N, V) in
        row-major order (= logits[tgt_mask]), skipping the output layer on padding.
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
                                       teacher_forcing, tgt_mask)
        return (logits, weights) if return_attention else logits

    def forward_with_attention(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor,
                               teacher_forcing: float = 1.0) -> tuple[Tensor, Tensor]:
        """Like forward, also returning the attention weights (B, T, S)."""
        return self.forward(src, src_lens, tgt_in, teacher_forcing, return_attention=True)


def _length_mask(lengths: Tensor, width: int) -> Tensor:
    """(B,) lengths -> (B, width) bool, True at positions < length."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def _as_config(model_cfg: Any) -> DictConfig:
    """A ModelConfig dataclass, DictConfig or plain dict -> a typed DictConfig."""
    if isinstance(model_cfg, DictConfig):
        return model_cfg
    try:
        if isinstance(model_cfg, dict):
            return OmegaConf.merge(OmegaConf.structured(ModelConfig), model_cfg)
        return OmegaConf.structured(model_cfg)
    except OmegaConfBaseException as err:  # a typo'd key or a wrong type
        first_line = str(err.msg).splitlines()[0]
        raise ConfigError(f"bad model config: {first_line} (model.{err.full_key}); see "
                          "ModelConfig in seq2seq/config.py for the keys and types") from None


def build_model(model_cfg: Any, src_vocab: int, tgt_vocab: int) -> Seq2Seq | ReferenceSeq2Seq:
    """Build a Seq2Seq from a ModelConfig (dataclass, DictConfig or dict) and vocab sizes;
    ``model.impl=reference`` builds the plain-torch ReferenceSeq2Seq instead (same interface).

    Raises ConfigError for an unknown rnn_type/attention/score or impossible sizes.
    """
    cfg = _as_config(model_cfg)
    for key in ("emb_size", "hidden_size", "enc_layers", "dec_layers"):
        if cfg[key] <= 0:
            raise ConfigError(f"model.{key}={cfg[key]} must be a positive integer")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.dropout} must be in [0, 1)")
    if min(src_vocab, tgt_vocab) < 4:
        raise ConfigError(f"vocabularies of {src_vocab} and {tgt_vocab} are too small: "
                          "they must hold at least PAD, UNK, BOS and EOS")
    rnn_class(cfg.rnn_type)  # raises ConfigError for an unknown type
    if cfg.impl == "reference":
        att = cfg.attention
        if att.name not in ATTENTIONS or (att.name == "luong" and att.score not in LUONG_SCORES):
            build_attention(att, 1, 1)  # raises the ConfigError that names the choices
        return ReferenceSeq2Seq(cfg, src_vocab, tgt_vocab)
    if cfg.impl != "fast":
        raise ConfigError(f"model.impl={cfg.impl!r}: use fast or reference")
    encoder = Encoder(src_vocab, cfg.emb_size, cfg.hidden_size, cfg.enc_layers, cfg.rnn_type,
                      cfg.dropout, cfg.bidirectional)
    enc_size = encoder.output_size
    attention = build_attention(cfg.attention, enc_size, cfg.hidden_size,
                                bidirectional=cfg.bidirectional)
    decoder = Decoder(tgt_vocab, cfg.emb_size, cfg.hidden_size, attention,
                      enc_final_size=enc_size, layers=cfg.dec_layers, rnn_type=cfg.rnn_type,
                      dropout=cfg.dropout, deep_output=cfg.deep_output, maxout=cfg.maxout,
                      tie_embeddings=cfg.tie_embeddings)
    return Seq2Seq(encoder, decoder)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
