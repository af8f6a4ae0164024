"""Thin Hydra entry points for the console scripts.

Each entry point composes the config, validates it and hands it to one module.
A :class:`~seq2seq.errors.Seq2SeqError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from seq2seq.config import register_configs, validate
from seq2seq.errors import Seq2SeqError

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")

register_configs()


def run_guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run ``fn(cfg)`` turning user errors into one clear line instead of a traceback."""
    try:
        validate(cfg)
        return fn(cfg)
    except Seq2SeqError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


@hydra.main(config_path=CONFIG_DIR, config_name="build", version_base="1.3")
def data_main(cfg: DictConfig) -> None:
    """`seq2seq-data`: build (or reuse) a corpus and its SentencePiece models."""
    from seq2seq.corpus.build import build_main

    run_guarded(build_main, cfg)


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def train_main(cfg: DictConfig) -> None:
    """`seq2seq-train`: train one model into a run folder."""
    from seq2seq.train import train_main as _train

    run_guarded(_train, cfg)
