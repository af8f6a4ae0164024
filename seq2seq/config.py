"""Structured configs (dataclasses registered in Hydra's ConfigStore).

The YAML files under ``configs/`` only set values; these schemas give every key
its type, so a typo or a wrong type fails when the config is composed, not an
hour into training. Range checks live in :func:`validate`; names that belong to
one module (attention names, corpus kinds) are checked by that module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from seq2seq.errors import ConfigError


@dataclass
class DataConfig:
    """Which parallel corpus to build/read and how to filter and split it."""

    name: str = MISSING  # folder under `root`: data/<name>/
    kind: str = MISSING  # sword | local | hub (only seq2seq.corpus knows these)
    root: str = "data"
    src_lang: str = "es"
    tgt_lang: str = "en"
    # kind=sword
    src_module: str = "spaRV1909eb"
    tgt_module: str = "engKJV2006eb"
    sword_path: str | None = None  # folder with mods.d/; else $SWORD_PATH, else /usr/share/sword
    # kind=local: TSV (src<TAB>tgt) or JSONL ({"translation": {src: .., tgt: ..}} or {src: .., tgt: ..})
    train_file: str | None = None
    valid_file: str | None = None
    test_file: str | None = None
    # kind=hub
    hub_name: str | None = None
    hub_config: str | None = None
    # filtering
    min_words: int = 1
    max_words: int = 200
    max_len_ratio: float = 2.5  # word-count ratio beyond which a pair is dropped as misaligned
    # splitting (by chapter / document for kind=sword; by line groups otherwise)
    split_seed: int = 1234
    valid_size: int = 1000  # approximate number of pairs
    test_per_bucket: int = 150  # minimum test segments per source-length bucket
    test_long_min_words: int = 60
    test_long_max_words: int = 120


@dataclass
class TokenizerConfig:
    """SentencePiece settings; trained on the train split only."""

    vocab_size: int = 8000
    joint: bool = False  # one model for both sides; else one per side
    model_type: str = "unigram"
    character_coverage: float = 1.0


@dataclass
class AttentionConfig:
    """The pluggable attention; names and scores are validated in attention.py."""

    name: str = "bahdanau"
    score: str = "general"  # luong only: dot | general | concat | scaled_dot
    input_feeding: bool = True  # luong only
    attn_size: int = 0  # additive/concat scorer size; 0 = hidden_size


@dataclass
class ModelConfig:
    rnn_type: str = "gru"  # gru | lstm
    emb_size: int = 256
    hidden_size: int = 256
    enc_layers: int = 1
    dec_layers: int = 1
    dropout: float = 0.2
    bidirectional: bool = True
    deep_output: bool = True
    maxout: bool = False
    tie_embeddings: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass
class TrainConfig:
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 = all cores
    bf16: bool = False  # autocast on CUDA
    batch_tokens: int = 3000  # target tokens per batch (padding excluded)
    max_src_words: int = 50  # pairs longer than this (source words) are not trained on
    lr: float = 1e-3
    lr_schedule: str = "plateau"  # constant | plateau | inverse_sqrt
    lr_decay: float = 0.5
    lr_patience: int = 2
    warmup_steps: int = 0
    min_lr: float = 1e-5
    clip_norm: float = 1.0
    label_smoothing: float = 0.0
    teacher_forcing: float = 1.0  # below 1.0: scheduled sampling with this ratio
    max_epochs: int = 20
    max_steps: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # 0 = no wall-clock limit
    valid_every: int = 500  # steps
    valid_bleu_sentences: int = 300  # greedy dev BLEU on this many sentences; 0 = off
    patience: int = 5  # validations without improvement before early stop; 0 = off
    resume: bool = False
    log_every: int = 50


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run_dir: str = "runs/${now:%Y-%m-%d_%H-%M-%S}"
    extra: dict[str, Any] = field(default_factory=dict)


def register_configs() -> None:
    """Register the schemas so YAML files are validated against them."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate(cfg: Any) -> None:
    """Range checks that a type alone cannot express; raises ConfigError with the fix."""
    m, t, tok, d = cfg.model, cfg.train, cfg.tokenizer, cfg.data
    for key in ("emb_size", "hidden_size", "enc_layers", "dec_layers"):
        _check(m[key] > 0, f"model.{key}={m[key]} must be a positive integer")
    _check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
    _check(m.rnn_type in ("gru", "lstm"), f"model.rnn_type={m.rnn_type!r}: use gru or lstm")
    _check(m.attention.attn_size >= 0, f"model.attention.attn_size={m.attention.attn_size} must be >= 0")
    _check(tok.vocab_size >= 16, f"tokenizer.vocab_size={tok.vocab_size} is too small (>= 16)")
    _check(t.batch_tokens > 0, f"train.batch_tokens={t.batch_tokens} must be positive")
    _check(t.lr > 0, f"train.lr={t.lr} must be positive")
    _check(0.0 <= t.label_smoothing < 1.0, f"train.label_smoothing={t.label_smoothing} must be in [0, 1)")
    _check(0.0 < t.teacher_forcing <= 1.0, f"train.teacher_forcing={t.teacher_forcing} must be in (0, 1]")
    _check(t.max_src_words > 0, f"train.max_src_words={t.max_src_words} must be positive")
    _check(t.lr_schedule in ("constant", "plateau", "inverse_sqrt"),
           f"train.lr_schedule={t.lr_schedule!r}: use constant, plateau or inverse_sqrt")
    _check(t.device in ("auto", "cpu", "cuda") or t.device.startswith("cuda:"),
           f"train.device={t.device!r}: use auto, cpu or cuda")
    _check(d.max_len_ratio >= 1.0, f"data.max_len_ratio={d.max_len_ratio} must be >= 1")
    _check(0 < d.min_words <= d.max_words, "data.min_words must be positive and <= data.max_words")
