"""Checkpoints: atomic writes, loading with clear errors, RNG state, and ``load_model``.

A checkpoint is one ``torch.save`` dict (see :func:`make_checkpoint`). It holds
only tensors and plain Python values, so it loads with ``weights_only=True``
(no arbitrary code runs when a checkpoint is opened).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import atomic_open
from seq2seq.errors import CheckpointError

FORMAT_VERSION = 1
BEST, LAST = "best.pt", "last.pt"
TOKENIZER_DIR = "tokenizer"  # inside a run folder: the SentencePiece models the run used
KEPT_DIR = "checkpoints"  # inside a run folder: the last train.keep_checkpoints validations
_REQUIRED = ("format", "model", "config", "vocab", "progress")


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through :func:`seq2seq.atomic.atomic_open`: readers see either the old
    file or the complete new one, even if the process dies or the disk fills."""
    try:
        with atomic_open(path, "wb") as fh:
            torch.save(obj, fh)
    except RuntimeError as err:  # torch reports a failed write (disk full) as RuntimeError
        if "writ" not in str(err):
            raise
        raise OSError(errno.ENOSPC, f"cannot write checkpoint: {str(err).splitlines()[0]}",
                      str(path)) from None


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy (global), torch CPU and CUDA generator states."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        # the array as a tensor: weights_only loading refuses NumPy objects
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def make_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    progress: dict[str, Any],
    cfg: DictConfig,
    vocab: dict[str, int],
    identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything needed to resume training exactly, or to rebuild the model for decoding.
    ``identity`` (:func:`run_identity`) names the tokenizers and corpus build it needs."""
    return {
        "identity": dict(identity or {}),
        "format": FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": capture_rng_state(),
        "progress": dict(progress),
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "vocab": dict(vocab),
    }


def kept_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the validation checkpoints kept in ``<run_dir>/checkpoints/``,
    oldest first (``train.keep_checkpoints``)."""
    folder = Path(run_dir) / KEPT_DIR
    found = []
    for path in folder.glob("step_*.pt") if folder.is_dir() else []:
        try:
            found.append((int(path.stem.removeprefix("step_")), path))
        except ValueError:  # not a name this module wrote
            continue
    return sorted(found)


def keep_checkpoint(run_dir: str | Path, step: int, keep: int) -> Path:
    """Keep ``last.pt`` as ``checkpoints/step_<step>.pt`` and drop all but the newest ``keep``.

    A hard link costs no write (``atomic_save`` replaces ``last.pt`` by a new file, so the
    kept one never changes); a copy where the file system has no hard links. Each kept
    file is a full checkpoint: it can be averaged (seq2seq-average) or resumed from.
    """
    run_dir = Path(run_dir)
    target = run_dir / KEPT_DIR / f"step_{step:08d}.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(run_dir / LAST, target)
    except OSError:
        shutil.copyfile(run_dir / LAST, target)
    drop_kept(run_dir, lambda s, rank: rank >= keep)
    return target


def drop_kept(run_dir: str | Path, doomed: Any) -> None:
    """Delete the kept checkpoints for which ``doomed(step, rank)`` is true (rank 0 = newest)."""
    for rank, (step, path) in enumerate(reversed(kept_checkpoints(run_dir))):
        if doomed(step, rank):
            path.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by this package; CheckpointError if missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} not found: train a model first with `seq2seq-train run_dir=...` "
            "or pass a run folder that holds best.pt or last.pt"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}): "
            f"delete it and resume from the other checkpoint in {path.parent}, or retrain"
        ) from err
    missing = [k for k in _REQUIRED if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path} is not a seq2seq checkpoint (missing {', '.join(missing)}): "
            "pass a best.pt/last.pt written by seq2seq-train"
        )
    if ckpt["format"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {ckpt['format']}, this version reads "
            f"{FORMAT_VERSION}: retrain, or use the seq2seq version that wrote it"
        )
    return ckpt


def find_checkpoint(run_dir_or_ckpt: str | Path) -> Path:
    """A checkpoint file given itself or its run folder (``best.pt``, else ``last.pt``)."""
    path = Path(run_dir_or_ckpt)
    if path.is_dir():
        for name in (BEST, LAST):
            if (path / name).is_file():
                return path / name
        raise CheckpointError(
            f"run folder {path} holds no {BEST} or {LAST}: train into it with "
            f"`seq2seq-train run_dir={path}` or point at another run folder"
        )
    if not path.exists():
        raise CheckpointError(
            f"{path} does not exist: pass a run folder written by seq2seq-train or a .pt file in it"
        )
    return path


# where a corpus lives may change between runs; what it holds may not
_MAY_MOVE = {"data": ("root", "sword_path")}


def check_same_setup(saved: dict[str, Any], cfg: DictConfig) -> list[str]:
    """A resumed run must keep the checkpoint's model, data and tokenizer settings.

    ``saved`` is the checkpoint's ``config``. Raises CheckpointError when one of
    those differs (the weights or the data would not fit); returns the train
    settings that differ (allowed, e.g. a larger ``max_steps``, but a changed
    ``batch_tokens`` or ``seed`` changes the batch order) so the caller can warn.
    """
    from seq2seq.config import Config

    now = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    # a key added to the schema after the checkpoint was written has its default there
    defaults = OmegaConf.to_container(OmegaConf.structured(Config), resolve=False, enum_to_str=True)
    for section in ("model", "data", "tokenizer"):
        old = {**{k: v for k, v in defaults[section].items() if k not in saved.get(section, {})},
               **saved.get(section, {})}
        diff = [k for k in now[section]
                if k not in _MAY_MOVE.get(section, ()) and old.get(k) != now[section][k]]
        if diff:
            raise CheckpointError(
                f"cannot resume: {section}.{', '.join(diff)} differ from the checkpoint's "
                "config; resume with the same settings (see config.yaml in the run folder)")
    old_train = {**defaults["train"], **saved.get("train", {})}
    return [f"train.{k}: {old_train.get(k)} -> {v}" for k, v in now["train"].items()
            if k != "resume" and old_train.get(k) != v]


def corpus_build_key(data_cfg: Any) -> str | None:
    """The build key of the corpus ``data_cfg`` names (None when its folder has no manifest)."""
    from seq2seq.corpus import corpus_dir
    from seq2seq.corpus.store import read_manifest

    return (read_manifest(corpus_dir(data_cfg)) or {}).get("build_key")


def run_identity(cfg: DictConfig, tokenizers: Any) -> dict[str, Any]:
    """What a checkpoint only fits with: its tokenizers' identity and its corpus's build key."""
    return {"tokenizer": tokenizers.identity(), "corpus": corpus_build_key(cfg.data)}


def check_identity(ckpt: dict[str, Any], identity: dict[str, Any], path: Path) -> None:
    """Refuse to resume ``ckpt`` (from ``path``) with other tokenizers or another corpus build,
    or when it holds no optimizer state (an averaged checkpoint). Checkpoints written before
    identities were recorded pass."""
    if ckpt.get("optimizer") is None:
        raise CheckpointError(f"{path} holds no optimizer state (an averaged checkpoint?): resume "
                              "from last.pt, best.pt or a kept checkpoints/step_*.pt")
    saved = ckpt.get("identity") or {}
    if saved.get("tokenizer") and saved["tokenizer"] != identity["tokenizer"]:
        raise CheckpointError(
            f"cannot resume {path}: the run folder's tokenizer/ is not the one it was trained "
            f"with ({identity['tokenizer']} != {saved['tokenizer']}); restore that folder")
    if saved.get("corpus") and identity["corpus"] and saved["corpus"] != identity["corpus"]:
        raise CheckpointError(
            f"cannot resume {path}: its corpus was rebuilt since (build key {saved['corpus']} "
            f"-> {identity['corpus']}); resume on the same build, or train a new run")


def config_from_checkpoint(ckpt: dict[str, Any]) -> DictConfig:
    """The run's resolved config, typed by the current schema where it still fits."""
    from seq2seq.config import Config

    saved = OmegaConf.create(ckpt["config"])
    try:
        return OmegaConf.merge(OmegaConf.structured(Config), saved)
    except Exception:  # a key the schema no longer knows: keep the config as it was saved
        return saved


def load_model(
    run_dir_or_ckpt: str | Path, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, Any, DictConfig]:
    """Rebuild a trained model for decoding: ``(model in eval mode, Tokenizers, cfg)``.

    ``run_dir_or_ckpt`` is a run folder (``best.pt`` preferred over ``last.pt``)
    or a checkpoint file inside one; the tokenizers come from the run folder's
    ``tokenizer/`` copy, so the run folder is all that is needed.
    """
    from seq2seq.corpus.tokenizer import Tokenizers
    from seq2seq.model import build_model

    path = find_checkpoint(run_dir_or_ckpt)
    ckpt = load_checkpoint(path, map_location=device)
    cfg = config_from_checkpoint(ckpt)
    tok_dir = path.parent / TOKENIZER_DIR
    if not tok_dir.is_dir():
        raise CheckpointError(
            f"{tok_dir} is missing: the run folder of {path.name} must keep the tokenizer/ "
            "folder seq2seq-train wrote next to it"
        )
    tokenizers = Tokenizers.load(tok_dir)
    saved = (ckpt.get("identity") or {}).get("tokenizer")
    if saved and saved != tokenizers.identity():
        raise CheckpointError(
            f"{tok_dir} is not the tokenizer {path.name} was trained with ({tokenizers.identity()} "
            f"!= {saved}): restore the run's own tokenizer/ folder")
    model = build_model(cfg.model, ckpt["vocab"]["src"], ckpt["vocab"]["tgt"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        raise CheckpointError(
            f"{path} does not match the model its config describes ({str(err).splitlines()[0]}): "
            "the checkpoint was written by an incompatible version; retrain"
        ) from err
    model.to(device).eval()
    return model, tokenizers, cfg
