"""Thin Hydra entry points for the console scripts.

Each entry point composes the config, validates it and hands it to one module.
A :class:`~seq2seq.errors.Seq2SeqError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from seq2seq.config import (
    CONFIG_DIR,
    register_configs,
    validate,
    validate_average,
    validate_evaluate,
    validate_reproduce,
    validate_serve,
    validate_translate,
)
from seq2seq.errors import Seq2SeqError
from seq2seq.training.preempt import Preempted

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def os_error_message(err: OSError) -> str:
    """One line naming the file, the problem and the fix; finished files are intact,
    since everything is written to a temp file first and renamed when complete."""
    what = f"{err.strerror or err} ({err.filename})" if err.filename else str(err.strerror or err)
    if err.errno in _FULL:
        return (f"{what}: free disk space (or raise the file size limit) and run the same "
                "command again; files written before are intact")
    if err.errno in _DENIED:
        return f"{what}: choose a folder you may write to (run_dir=, out_dir=, output=)"
    return f"{what}: check the path and try again"


register_configs()


def run_guarded(
    fn: Callable[[DictConfig], Any],
    cfg: DictConfig,
    check: Callable[[DictConfig], None] = validate,
) -> Any:
    """Run ``check(cfg)`` then ``fn(cfg)``, turning user errors into one clear line
    instead of a traceback."""
    try:
        check(cfg)
        return fn(cfg)
    except Preempted as err:
        print(f"stopped: {err}", file=sys.stderr)
        sys.exit(err.code)
    except Seq2SeqError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # disk full, permission denied, a vanished folder: one line
        print(f"error: {os_error_message(err)}", file=sys.stderr)
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
    from seq2seq.training.loop import train_main as _train

    run_guarded(lambda c: _train_process(with_folder_config(c), _train), sweep_run_dir(cfg))


def _train_process(cfg: DictConfig, train: Callable[[DictConfig], Any]) -> Any:
    """The training command's process-wide settings (threads, malloc, denormals), then ``train``."""
    from seq2seq.runtime import apply_training_settings

    apply_training_settings(cfg.train)
    return train(cfg)


def _decode_process(cfg: DictConfig, decode: Callable[[DictConfig], Any]) -> Any:
    """The decoding commands' process-wide setting, then ``decode``: glibc keeps freed
    memory for reuse (runtime.keep_freed_memory). Every beam-search step frees and
    re-allocates (rows, vocabulary) logits of several MB, which glibc would otherwise
    hand back and fault in again zero-filled (docs/performance.md#keeping-freed-memory)."""
    from seq2seq.runtime import keep_freed_memory

    keep_freed_memory()
    return decode(cfg)


def with_folder_config(cfg: DictConfig) -> DictConfig:
    """A resume takes the run folder's config.yaml, with this command line's overrides on
    top (seq2seq.runs.folder.folder_config)."""
    from hydra.core.hydra_config import HydraConfig

    from seq2seq.runs.folder import folder_config

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return folder_config(cfg, overrides)


def sweep_run_dir(cfg: DictConfig) -> DictConfig:
    """In a multirun, a job without an explicit ``run_dir=`` trains into its own sweep
    folder (hydra.sweep.dir/<overrides>): the default ``runs/<second>`` would be shared
    by jobs that start in the same second, and they would overwrite each other."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return cfg
    hc = HydraConfig.get()
    explicit = any(o.split("=", 1)[0].lstrip("+~") == "run_dir" for o in hc.overrides.task)
    if hc.mode == RunMode.MULTIRUN and not explicit:
        cfg.run_dir = hc.runtime.output_dir
    return cfg


@hydra.main(config_path=CONFIG_DIR, config_name="translate", version_base="1.3")
def translate_main(cfg: DictConfig) -> None:
    """`seq2seq-translate run=<run folder> beam=5`: a prompt on a terminal, else a filter."""
    from seq2seq.inference.command import translate_main as _translate

    run_guarded(lambda c: _decode_process(c, _translate), cfg, check=validate_translate)


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def evaluate_main(cfg: DictConfig) -> None:
    """`seq2seq-evaluate run=<run folder> split=test beam=5` (or runs=[a,b] to compare)."""
    from seq2seq.evaluation.command import evaluate_main as _evaluate

    def _run(c: DictConfig) -> Any:
        from seq2seq.runtime import set_threads

        set_threads(c.threads)  # the process's setting, made here and nowhere in the library
        return _decode_process(c, _evaluate)

    run_guarded(_run, cfg, check=validate_evaluate)


@hydra.main(config_path=CONFIG_DIR, config_name="reproduce", version_base="1.3")
def reproduce_main(cfg: DictConfig) -> None:
    """`seq2seq-reproduce [profile=quick|paper]`: train the arms, evaluate, write the report."""
    from seq2seq.experiments.reproduce import reproduce_main as _reproduce

    run_guarded(lambda c: _train_process(c, _reproduce), cfg, check=validate_reproduce)


@hydra.main(config_path=CONFIG_DIR, config_name="average", version_base="1.3")
def average_main(cfg: DictConfig) -> None:
    """`seq2seq-average run=<run folder> last=5`: average kept checkpoints into one."""
    from seq2seq.runs.average import average_main as _average

    run_guarded(_average, cfg, check=validate_average)


@hydra.main(config_path=CONFIG_DIR, config_name="serve", version_base="1.3")
def serve_main(cfg: DictConfig) -> None:
    """`seq2seq-serve reproduction=<folder>` or `runs=[...]`: the JSON API and the page."""
    from seq2seq.serve.command import serve_main as _serve

    run_guarded(lambda c: _decode_process(c, _serve), cfg, check=validate_serve)
