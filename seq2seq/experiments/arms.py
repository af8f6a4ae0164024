"""The arms of a reproduction: their training configs, and training (or reusing) each one.

An arm is one model of :mod:`seq2seq.experiments.reproduce`'s profile: the shared base
config with its own ``model/attention`` group and, for RNNsearch-30/-50, its length cap,
trained in its own run folder ``<out_dir>/arms/<name>`` (``.../seed<k>`` per seed).

Interrupted, training resumes: an arm with ``summary.json`` is not trained again (after
checking that it was trained with the settings asked for now), a half-trained arm resumes
from ``last.pt``, and the wall time of its training phase is summed over the invocations.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seq2seq import atomic, runtime
from seq2seq.config import BOOKKEEPING_KEYS, Config, group_options
from seq2seq.config import CONFIG_DIR as CONFIG_DIR_NAME
from seq2seq.errors import ConfigError
from seq2seq.runs.checkpoint import LAST

log = logging.getLogger(__name__)
CONFIG_DIR = Path(CONFIG_DIR_NAME)
ARMS_DIR = "arms"
PHASE_FILE = "reproduce_phase.json"  # in each arm's folder: wall time of its training phase
_SETUP_SECTIONS = ("data", "tokenizer", "model", "train")


# ------------------------------------------------------------------ arm configs
def attention_group(name: str) -> DictConfig:
    """The ``model/attention=<name>`` group file, as Hydra would select it."""
    folder = CONFIG_DIR / "model" / "attention"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"reproduce arm attention {name!r} has no configs/model/attention/"
                          f"{name}.yaml: use one of {group_options('model/attention')}")
    return OmegaConf.load(path)


def arm_dir(out_dir: str | Path, name: str, seed: int | None = None) -> Path:
    """An arm's run folder: ``<out_dir>/arms/<name>``, or ``.../<name>/seed<k>`` per seed."""
    folder = Path(out_dir) / ARMS_DIR / name
    return folder if seed is None else folder / f"seed{seed}"


def arm_config(cfg: DictConfig, name: str, arm: DictConfig, seed: int | None = None
               ) -> DictConfig:
    """The training config of one arm: the shared base with ``model/attention=<arm>``,
    the arm's length cap, and its run folder (:func:`arm_dir`); ``seed`` replaces
    ``train.seed`` (multi-seed runs)."""
    base = {k: OmegaConf.to_container(cfg[k], resolve=True, enum_to_str=True)
            for k in (*_SETUP_SECTIONS, "extra")}
    arm_cfg = OmegaConf.merge(OmegaConf.structured(Config), base)
    arm_cfg.model.attention = OmegaConf.merge(arm_cfg.model.attention,
                                              attention_group(arm.attention))
    if arm.max_src_words:
        arm_cfg.train.max_src_words = arm.max_src_words
    if seed is not None:
        arm_cfg.train.seed = seed
    arm_cfg.run_dir = str(arm_dir(cfg.reproduce.out_dir, name, seed))
    arm_cfg.train.resume = False
    return arm_cfg


def arm_configs(cfg: DictConfig, seed: int | None = None) -> dict[str, DictConfig]:
    """Every arm's config, checked before anything slow runs (an arm merges into the
    structured schema, so a bad attention name fails here)."""
    from seq2seq.config import validate

    out = {}
    for name, arm in cfg.reproduce.arms.items():
        out[name] = arm_config(cfg, name, arm, seed)
        validate(out[name])
    return out


def _setup_of(cfg: Any) -> dict[str, Any]:
    """The settings a finished arm must share with the current config to be reused: keys
    missing in an older arm's config.yaml count as their schema default, and the train
    keys that only say how a run is kept and logged (BOOKKEEPING_KEYS) do not count."""
    plain = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    defaults = OmegaConf.to_container(OmegaConf.structured(Config), resolve=False, enum_to_str=True)
    setup = {k: {**defaults[k], **plain[k]} for k in _SETUP_SECTIONS}
    for key in BOOKKEEPING_KEYS:
        setup["train"].pop(key, None)
    return setup


def check_finished_arm(arm_cfg: DictConfig) -> None:
    """Refuse to reuse an arm trained with other settings than the ones asked for now."""
    saved_path = Path(arm_cfg.run_dir) / "config.yaml"
    if not saved_path.is_file():
        return
    saved = _setup_of(OmegaConf.to_container(OmegaConf.load(saved_path), resolve=True, enum_to_str=True))
    now = _setup_of(arm_cfg)
    diff = [f"{s}.{k}" for s in _SETUP_SECTIONS for k in now[s]
            if saved[s].get(k) != now[s][k]]
    if diff:
        raise ConfigError(
            f"{arm_cfg.run_dir} was trained with other settings ({', '.join(diff[:5])} "
            "differ): pass reproduce.out_dir=<a new folder>, or delete that arm to retrain it")



# --------------------------------------------------------------------- training
def train_arm(name: str, arm_cfg: DictConfig) -> dict[str, Any]:
    """Train one arm unless it has finished; resume it if it has a ``last.pt``.

    Returns its ``summary.json`` plus ``parameters``, ``phase_s`` (wall time of the
    whole training phase: set-up, steps, validations, checkpoints; summed over
    resumed invocations) and ``trained_now`` (False when it was reused).
    """
    from seq2seq.training.loop import train_main

    runtime.set_threads(runtime.threads_per_rank(arm_cfg.train.threads))  # after a decoding
    run_dir = Path(arm_cfg.run_dir)
    phase_file = run_dir / PHASE_FILE
    summary_file = run_dir / "summary.json"
    if summary_file.is_file() and atomic.read_json(summary_file) is None:
        log.warning("arm %s: %s is damaged; the arm is finished again from its checkpoint",
                    name, summary_file)
        summary_file.unlink()
    trained_now = not summary_file.is_file()
    if trained_now:
        arm_cfg.train.resume = (run_dir / LAST).is_file()
        # the arm's folder is the reproduction's own: what a run killed before its first
        # checkpoint left there is replaced, not refused
        arm_cfg.train.overwrite = not arm_cfg.train.resume
        log.info("arm %s: %s training in %s", name,
                 "resuming" if arm_cfg.train.resume else "starting", run_dir)
        before = _read_phase(phase_file) if arm_cfg.train.resume else 0.0
        start = time.perf_counter()
        try:
            train_main(arm_cfg)
        finally:  # an interrupted phase still counts when the arm is resumed
            if run_dir.is_dir():
                atomic.write_json(phase_file,
                                  {"phase_s": round(before + time.perf_counter() - start, 1)})
    else:
        check_finished_arm(arm_cfg)
        log.info("arm %s: finished before (%s), not trained again", name, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["parameters"] = json.loads((run_dir / "params.json").read_text())["parameters"]
    summary["phase_s"] = _read_phase(phase_file) or summary.get("wall_time_s")
    summary["trained_now"] = trained_now
    return summary


def _read_phase(path: Path) -> float:
    try:
        return float(json.loads(path.read_text())["phase_s"])
    except (OSError, ValueError, KeyError):
        return 0.0

def train_arms(cfg: DictConfig, arm_cfgs: Mapping[str, DictConfig], timings: dict[str, Any],
               seed: int | None = None) -> dict[str, dict[str, Any]]:
    """Train (or reuse) every arm of ``arm_cfgs``; returns each one's summary + ``spec``."""
    tag = "" if seed is None else f" seed{seed}"
    arms = {}
    for i, (name, arm_cfg) in enumerate(arm_cfgs.items(), 1):
        log.info("arm %d/%d: %s (%s attention)%s", i, len(arm_cfgs), name,
                 arm_cfg.model.attention.name, tag)
        arms[name] = train_arm(name, arm_cfg)
        arms[name]["spec"] = OmegaConf.to_container(cfg.reproduce.arms[name], enum_to_str=True)
        timings[f"train {name}{tag}"] = {"seconds": arms[name]["phase_s"],
                                         "cached": not arms[name]["trained_now"]}
    return arms
