"""Checkpoint averaging: `seq2seq-average run=<run folder> last=5`.

A run trained with ``train.keep_checkpoints=N`` keeps the checkpoints of its last N
validations in ``<run>/checkpoints/step_<step>.pt``. Averaging the parameters of the
last few (Vaswani et al. 2017; JoeyNMT's and fairseq's ``average_checkpoints``) often
decodes better than any one of them, because the iterates of a constant or slowly
decaying learning rate scatter around a better point.

The averaged checkpoint (default ``<run>/averaged.pt``) has the newest checkpoint's
config, vocabulary and progress, with ``progress["averaged_steps"]`` listing what went
in, and no optimizer state: every command that loads a model takes it
(``seq2seq-translate run=<run>/averaged.pt``, ``seq2seq-evaluate run=...``), but
training cannot resume from it. It must stay inside the run folder, next to the
``tokenizer/`` folder it decodes with.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.runs.checkpoint import atomic_save, kept_checkpoints, load_checkpoint

log = logging.getLogger(__name__)
AVERAGED = "averaged.pt"


def average_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts with the same keys and shapes (accumulated in
    float64, returned in each tensor's own dtype; integer buffers come from the last)."""
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if list(state) != keys or any(state[k].shape != states[0][k].shape for k in keys):
            raise CheckpointError(f"checkpoint {i + 1} of {len(states)} has other parameters "
                                  "than the first: average checkpoints of one run only")
    out = {}
    for key in keys:
        first = states[0][key]
        if not first.is_floating_point():
            out[key] = states[-1][key].clone()
            continue
        total = torch.zeros_like(first, dtype=torch.float64)
        for state in states:
            total += state[key].double()
        out[key] = (total / len(states)).to(first.dtype)
    return out


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Any]:
    """One checkpoint whose model is the mean of ``paths``' models (the last one's metadata)."""
    if not paths:
        raise ConfigError("nothing to average: no checkpoints given")
    ckpts = [load_checkpoint(p) for p in paths]
    models = [c["config"]["model"] for c in ckpts]
    if any(m != models[0] for m in models[1:]):
        raise CheckpointError("the checkpoints describe different models (model.* differs): "
                              "average checkpoints of one run only")
    newest = ckpts[-1]
    progress = {**newest["progress"], "averaged_steps": [c["progress"]["step"] for c in ckpts]}
    return {**newest, "model": average_state_dicts([c["model"] for c in ckpts]),
            "optimizer": None, "scheduler": None, "progress": progress}


def chosen_checkpoints(cfg: Any) -> tuple[list[Path], Path]:
    """The files to average (oldest first) and the run folder they belong to."""
    if cfg.checkpoints:
        paths = [Path(p).expanduser() for p in cfg.checkpoints]
        folders = {p.resolve().parent.parent if p.parent.name == "checkpoints"
                   else p.resolve().parent for p in paths}
        if len(folders) != 1:
            raise ConfigError(f"checkpoints={list(cfg.checkpoints)} come from {len(folders)} run "
                              "folders: average checkpoints of one run")
        return paths, folders.pop()
    if not cfg.run:
        raise ConfigError("pass run=<run folder> (with last=N) or checkpoints=[a.pt,b.pt]")
    run = Path(cfg.run).expanduser()
    if not run.is_dir():
        raise ConfigError(f"run={run} is not a run folder")
    if cfg.last < 1:
        raise ConfigError(f"last={cfg.last} must be at least 1")
    kept = kept_checkpoints(run)
    if len(kept) < cfg.last:
        raise ConfigError(
            f"{run} keeps {len(kept)} validation checkpoint(s) in checkpoints/, last={cfg.last} "
            "asks for more: lower last=, or train with train.keep_checkpoints=N (N >= last)")
    return [path for _, path in kept[-cfg.last:]], run


def average_main(cfg: Any) -> Path:
    """`seq2seq-average`: write the averaged checkpoint; returns its path."""
    paths, run = chosen_checkpoints(cfg)
    out = Path(cfg.output).expanduser() if cfg.output else run / AVERAGED
    averaged = average_checkpoints(paths)
    try:
        atomic_save(averaged, out)
    except OSError as err:
        raise ConfigError(f"cannot write {out} ({err.strerror}): free disk space or choose "
                          "another output=") from None
    steps = averaged["progress"]["averaged_steps"]
    print(f"averaged {len(paths)} checkpoints (steps {', '.join(map(str, steps))}) into {out}")
    if out.resolve().parent != run.resolve():
        print(f"note: {out} is outside {run}; keep it next to the run's tokenizer/ folder to "
              "decode with it")
    return out
