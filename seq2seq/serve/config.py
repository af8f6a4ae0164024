"""The schema of `seq2seq-serve` (registered in Hydra's ConfigStore as ``serve_schema``)
and the range checks a type alone cannot express.

Kept apart from :mod:`seq2seq.config` so the server is one subpackage; this module
imports only Hydra and the standard library, so the command line stays fast to start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class LimitsConfig:
    """What one request may ask for; going over a limit is a 4xx JSON error naming it."""

    max_chars: int = 1000  # characters per sentence
    max_sentences: int = 16  # sentences per request
    max_beam: int = 10
    max_nbest: int = 5
    timeout_s: float = 30.0  # a request still undecoded after this long gets 408
    max_queue: int = 64  # requests waiting for the decoder; more get 429


@dataclass
class ServeConfig:
    """Primary schema of `seq2seq-serve`; its keys are top-level (runs=... port=...)."""

    # run folders (or checkpoints) to serve; an element that is itself a list is one
    # ensemble (seq2seq/ensemble.py)
    runs: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # display names for runs; default: folder names
    # or a seq2seq-reproduce output folder: every arm under arms/, one model per arm
    reproduction: str = ""
    seed: int = 0  # with reproduction= and seed folders (arms/<arm>/seed<k>): which k; 0 = lowest
    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 exposes the server to the network
    port: int = 8000  # 0 = any free port (the URL is printed)
    beam: int = 5  # the page's initial beam
    alpha: float = 0.6  # GNMT length penalty of the beam score
    max_len_ratio: float = 2.0  # output cap: int(ratio * source subwords) + max_len_extra
    max_len_extra: int = 10
    max_src_tokens: int = 0  # longer inputs are cut (and flagged); 0 = 4 x the run's train.max_src_words
    batch_tokens: int = 2000  # padded source subwords per decoding batch
    device: str = "cpu"  # cpu | cuda | auto
    # torch intra-op threads of the decoding thread; 0 = all cores. One leaves a core to the
    # HTTP event loop, and small batches gain little from more (see seq2seq.config.TranslateConfig.threads)
    threads: int = 1
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    log_level: str = "warning"  # uvicorn's: critical | error | warning | info | debug


def register_serve_config() -> None:
    ConfigStore.instance().store(name="serve_schema", node=ServeConfig)


def validate_serve(cfg: Any) -> None:
    """Exactly one of runs= / reproduction=, and sane ports, settings and limits;
    ConfigError naming the key and the fix."""
    from seq2seq.config import check as _check  # the one layer: same message style
    from seq2seq.config import check_device
    from seq2seq.constants import MAX_BEAM

    _check(bool(cfg.runs) != bool(cfg.reproduction),
           "no model given: pass runs=[<run folder>,...] or reproduction=<seq2seq-reproduce "
           "folder>, e.g. seq2seq-serve reproduction=runs/reproduce_quick"
           if not cfg.runs else "pass runs=[...] or reproduction=<folder>, not both")
    _check(not cfg.names or len(cfg.names) == len(cfg.runs),
           f"names={list(cfg.names)} must give one name per run")
    _check(0 <= cfg.port <= 65535, f"port={cfg.port} must be between 0 (any free port) and 65535")
    _check(cfg.seed >= 0, f"seed={cfg.seed} must be >= 0 (0 = the lowest seed found)")
    _check(cfg.alpha >= 0, f"alpha={cfg.alpha} must be >= 0 (0 = no length penalty)")
    _check(cfg.max_len_ratio > 0, f"max_len_ratio={cfg.max_len_ratio} must be positive")
    _check(cfg.max_len_extra >= 0, f"max_len_extra={cfg.max_len_extra} must be >= 0")
    _check(cfg.max_src_tokens >= 0, f"max_src_tokens={cfg.max_src_tokens} must be >= 0")
    _check(cfg.batch_tokens > 0, f"batch_tokens={cfg.batch_tokens} must be positive")
    _check(cfg.threads >= 0, f"threads={cfg.threads} must be >= 0 (0 = all cores)")
    check_device(cfg.device)
    _check(cfg.log_level in ("critical", "error", "warning", "info", "debug"),
           f"log_level={cfg.log_level!r}: use critical, error, warning, info or debug")
    lim = cfg.limits
    for key in ("max_chars", "max_sentences", "max_beam", "max_nbest", "max_queue"):
        _check(lim[key] >= 1, f"limits.{key}={lim[key]} must be at least 1")
    _check(lim.max_beam <= MAX_BEAM, f"limits.max_beam={lim.max_beam} must be <= {MAX_BEAM}")
    _check(lim.max_nbest <= lim.max_beam, f"limits.max_nbest={lim.max_nbest} must be <= "
           f"limits.max_beam={lim.max_beam}")
    _check(lim.timeout_s > 0, f"limits.timeout_s={lim.timeout_s} must be positive")
    _check(1 <= cfg.beam <= lim.max_beam, f"beam={cfg.beam} must be between 1 and "
           f"limits.max_beam={lim.max_beam}")
