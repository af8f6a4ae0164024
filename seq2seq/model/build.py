"""build_model(cfg): the fast model, or the reference one with ``model.impl=reference``."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn

from seq2seq.config import ModelConfig, ModelImpl, validate_model
from seq2seq.errors import ConfigError
from seq2seq.model.attention import build_attention
from seq2seq.model.decoder import Decoder
from seq2seq.model.encoder import Encoder
from seq2seq.model.fast import Seq2Seq
from seq2seq.model.reference import ReferenceSeq2Seq


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
                          "ModelConfig in seq2seq/config/schema.py for the keys and types") from None


def build_model(model_cfg: Any, src_vocab: int, tgt_vocab: int) -> Seq2Seq | ReferenceSeq2Seq:
    """Build a Seq2Seq from a ModelConfig (dataclass, DictConfig or dict) and vocab sizes;
    ``model.impl=reference`` builds the plain-torch ReferenceSeq2Seq instead (same interface).

    Raises ConfigError for an unknown rnn_type/attention/score or impossible sizes.
    """
    cfg = _as_config(model_cfg)
    validate_model(cfg)
    if min(src_vocab, tgt_vocab) < 4:
        raise ConfigError(f"vocabularies of {src_vocab} and {tgt_vocab} are too small: "
                          "they must hold at least PAD, UNK, BOS and EOS")
    if cfg.impl == ModelImpl.reference:
        return ReferenceSeq2Seq(cfg, src_vocab, tgt_vocab)
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
