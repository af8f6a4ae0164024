"""A run folder belongs to one run: an advisory lock, the fresh-or-resume decision, cleanup.

- :class:`FolderLock`: ``<run_dir>/.lock``, held (``flock``) while a trainer runs; a
  second trainer into the same folder is refused with the holder's pid. The kernel
  drops the lock when its process dies, even by SIGKILL, so a stale lock never blocks.
- :func:`claim`: a fresh run refuses a folder that holds another run's files unless
  ``train.overwrite=true`` (which deletes them first, so no file of the old run
  survives next to the new one); it names ``train.resume=true`` as the other way.
- :func:`resume_checkpoint`: which checkpoint a resumed run starts from
  (``train.resume_from``: ``last``, ``best``, or a file).
- Temp files a killed writer left behind are deleted once the lock is held.
- :func:`folder_config`: a resume continues with the folder's own ``config.yaml``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import remove_temp_files
from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.runs.checkpoint import BEST, KEPT_DIR, LAST, TOKENIZER_DIR

LOCK = ".lock"
# what a training run writes; Hydra's .hydra/ and log files are not a run's
RUN_FILES = (LAST, BEST, "metrics.csv", "dev_buckets.csv", "config.yaml", "params.json",
             "summary.json", TOKENIZER_DIR, KEPT_DIR, "tensorboard", "averaged.pt")


class FolderLock:
    """An exclusive ``flock`` on ``<folder>/.lock`` holding the owner's pid."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK
        self._fh: IO[str] | None = None

    def acquire(self) -> FolderLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise ConfigError(
                f"run folder {self.path.parent} is in use by another trainer (pid {holder}): "
                "wait for it to finish, stop it, or choose another run_dir") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def run_files(folder: str | Path) -> list[str]:
    """The files and folders of a training run present in ``folder``."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()]


def claim(folder: str | Path, t: Any) -> FolderLock:
    """Lock ``folder`` for this run and check it fits ``train.resume``/``train.overwrite``;
    removes leftover temp files. ConfigError (lock held, or a fresh run into another
    run's files) names the way out."""
    folder = Path(folder)
    lock = FolderLock(folder).acquire()
    try:
        present = run_files(folder)
        if present and not t.resume:
            if not t.overwrite:
                raise ConfigError(
                    f"run_dir {folder} already holds a run ({', '.join(present)}): pass "
                    "train.resume=true to continue it, train.overwrite=true to replace it, or "
                    "choose another run_dir")
            for name in present:
                path = folder / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        remove_temp_files(folder)
    except BaseException:
        lock.release()
        raise
    return lock


def resume_checkpoint(run_dir: str | Path, resume: bool, resume_from: str = "last"
                      ) -> Path | None:
    """The checkpoint a run resumes from (None for a fresh run).

    ``resume_from``: ``last`` (``last.pt``), ``best`` (``best.pt``, e.g. when ``last.pt``
    was lost), or a checkpoint file (a kept ``checkpoints/step_*.pt``).
    """
    if not resume:
        return None
    run_dir = Path(run_dir)
    named = {"last": run_dir / LAST, "best": run_dir / BEST}
    path = named.get(resume_from, Path(resume_from).expanduser())
    if not path.is_file():
        other = " (resume from best.pt with train.resume_from=best)" if (
            resume_from == "last" and (run_dir / BEST).is_file()) else ""
        raise CheckpointError(
            f"train.resume=true but {path} does not exist{other}: pass run_dir=<the folder of "
            "the run to resume>, or drop train.resume to start afresh")
    return path


# what a resume may change besides the bookkeeping keys: budgets, and where things run
_MAY_CHANGE = ("train.max_steps", "train.max_minutes", "train.max_epochs", "train.patience",
               "train.threads", "train.device", "train.valid_every", "train.distributed",
               "run_dir", "data.root", "data.sword_path")


def folder_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """For ``train.resume=true``: the run folder's own ``config.yaml`` with the command
    line's ``overrides`` on top, so a resume needs only ``run_dir=X train.resume=true``.

    An override may change only a budget or bookkeeping key (``_MAY_CHANGE``,
    ``BOOKKEEPING_KEYS``); any other change is refused, naming the key. Without a
    ``config.yaml`` (or for a fresh run) ``cfg`` is returned as it is.
    """
    from seq2seq.config import BOOKKEEPING_KEYS, Config

    saved = Path(cfg.run_dir) / "config.yaml"
    if not cfg.train.resume or not saved.is_file():
        return cfg
    try:
        base = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(saved))
    except Exception as err:  # an unknown key from another version, or a damaged file
        raise ConfigError(f"cannot read {saved} ({type(err).__name__}): repair it or resume "
                          "with the full command line of the original run") from None
    allowed = {*_MAY_CHANGE, *(f"train.{k}" for k in BOOKKEEPING_KEYS)}
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        path = key.replace("/", ".")
        if path.startswith("hydra."):
            continue
        new, old = OmegaConf.select(cfg, path), OmegaConf.select(base, path)
        if path in allowed:
            OmegaConf.update(base, path, new, merge=False)
        elif new is None and old is None:  # a group such as experiment=...: it sets other keys
            raise ConfigError(f"cannot resume with {item}: a config group would change the run's "
                              f"settings; resume with run_dir={cfg.run_dir} train.resume=true "
                              "and budget keys only")
        elif new != old:
            raise ConfigError(
                f"cannot resume with {item}: the run in {cfg.run_dir} has {path}={old}; only "
                "budget and bookkeeping keys may change on resume (e.g. train.max_minutes, "
                "train.max_steps); start a new run_dir to change it")
    base.run_dir = cfg.run_dir
    base.train.resume = True
    return base
