"""`seq2seq-reproduce` (`make reproduce`): BLEU versus sentence length, one command.

Builds the corpus if needed, trains every arm of the profile (same data, seed, sizes
and budget; only the attention and, for RNNsearch-30/-50, the length cap differ),
decodes the evaluation splits with each, translates them with Apertium, scores
everything by source-length bucket, runs the paired and ratio-trend tests against
each arm's baseline, judges the criteria of GUIDE §4 from the numbers, and writes
into ``reproduce.out_dir``::

    report.md           what was run, tables, criteria with PASS/FAIL, timings
    bleu_vs_length.png  BLEU per bucket, one line per system, 95% CI bands
    results.json        every number in the report
    scores_<split>.csv  per system x bucket (and .json)
    arms/<name>/        each arm's run folder (checkpoints, logs, eval cache)

Interrupted, it resumes: an arm with ``summary.json`` is not trained again, a
half-trained arm resumes from ``last.pt``, decodings come from the eval cache
(keyed by checkpoint content) and Apertium's from ``apertium/``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seq2seq import report
from seq2seq.checkpoint import LAST
from seq2seq.config import Config
from seq2seq.errors import ConfigError
from seq2seq.evaluation import (
    SystemOutput,
    apertium_output,
    compare,
    decode_run,
    score_system,
)
from seq2seq.reproduce_report import criteria, render_report

log = logging.getLogger(__name__)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ARMS_DIR, APERTIUM = "arms", "apertium"
PHASE_FILE = "reproduce_phase.json"  # in each arm's folder: wall time of its training phase
_SETUP_SECTIONS = ("data", "tokenizer", "model", "train")


# ------------------------------------------------------------------ arm configs
def attention_group(name: str) -> DictConfig:
    """The ``model/attention=<name>`` group file, as Hydra would select it."""
    folder = CONFIG_DIR / "model" / "attention"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(f"reproduce arm attention {name!r} has no configs/model/attention/"
                          f"{name}.yaml: use one of {known}")
    return OmegaConf.load(path)


def arm_config(cfg: DictConfig, name: str, arm: DictConfig) -> DictConfig:
    """The training config of one arm: the shared base with ``model/attention=<arm>``,
    the arm's length cap, and its run folder under ``<out_dir>/arms/``."""
    base = {k: OmegaConf.to_container(cfg[k], resolve=True)
            for k in (*_SETUP_SECTIONS, "extra")}
    arm_cfg = OmegaConf.merge(OmegaConf.structured(Config), base)
    arm_cfg.model.attention = OmegaConf.merge(arm_cfg.model.attention,
                                              attention_group(arm.attention))
    if arm.max_src_words:
        arm_cfg.train.max_src_words = arm.max_src_words
    arm_cfg.run_dir = str(Path(cfg.reproduce.out_dir) / ARMS_DIR / name)
    arm_cfg.train.resume = False
    return arm_cfg


def arm_configs(cfg: DictConfig) -> dict[str, DictConfig]:
    """Every arm's config, checked (a model of each builds) before anything slow runs."""
    from seq2seq.config import validate
    from seq2seq.train import check_model_config

    out = {}
    for name, arm in cfg.reproduce.arms.items():
        out[name] = arm_config(cfg, name, arm)
        validate(out[name])
        check_model_config(out[name].model)
    return out


def _setup_of(cfg: Any) -> dict[str, Any]:
    """The settings a finished arm must share with the current config to be reused."""
    plain = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    setup = {k: dict(plain[k]) for k in _SETUP_SECTIONS}
    setup["train"].pop("resume", None)
    return setup


def check_finished_arm(arm_cfg: DictConfig) -> None:
    """Refuse to reuse an arm trained with other settings than the ones asked for now."""
    saved_path = Path(arm_cfg.run_dir) / "config.yaml"
    if not saved_path.is_file():
        return
    saved = _setup_of(OmegaConf.to_container(OmegaConf.load(saved_path), resolve=True))
    now = _setup_of(arm_cfg)
    diff = [f"{s}.{k}" for s in _SETUP_SECTIONS for k in now[s]
            if saved[s].get(k) != now[s][k]]
    if diff:
        raise ConfigError(
            f"{arm_cfg.run_dir} was trained with other settings ({', '.join(diff[:5])} "
            "differ): pass reproduce.out_dir=<a new folder>, or delete that arm to retrain it")


# ---------------------------------------------------------------------- phases
def build_corpus(cfg: DictConfig) -> dict[str, Any]:
    """Build (or reuse) the corpus and its tokenizers; returns the phase's timing."""
    from seq2seq.corpus import corpus_dir
    from seq2seq.corpus.build import build_main
    from seq2seq.corpus.store import read_manifest

    def built_at() -> str | None:
        return (read_manifest(corpus_dir(cfg.data)) or {}).get("built_at")

    before, start = built_at(), time.perf_counter()
    build_main(cfg)
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 1), "cached": before is not None and before == built_at()}


def train_arm(name: str, arm_cfg: DictConfig) -> dict[str, Any]:
    """Train one arm unless it has finished; resume it if it has a ``last.pt``.

    Returns its ``summary.json`` plus ``parameters``, ``phase_s`` (wall time of the
    whole training phase: set-up, steps, validations, checkpoints; summed over
    resumed invocations) and ``trained_now`` (False when it was reused).
    """
    from seq2seq.train import train_main

    run_dir = Path(arm_cfg.run_dir)
    phase_file = run_dir / PHASE_FILE
    trained_now = not (run_dir / "summary.json").is_file()
    if trained_now:
        arm_cfg.train.resume = (run_dir / LAST).is_file()
        log.info("arm %s: %s training in %s", name,
                 "resuming" if arm_cfg.train.resume else "starting", run_dir)
        before = _read_phase(phase_file) if arm_cfg.train.resume else 0.0
        start = time.perf_counter()
        try:
            train_main(arm_cfg)
        finally:  # an interrupted phase still counts when the arm is resumed
            if run_dir.is_dir():
                phase_file.write_text(json.dumps(
                    {"phase_s": round(before + time.perf_counter() - start, 1)}) + "\n")
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


def _groups(cfg: DictConfig) -> dict[str, list[str]]:
    """baseline arm -> the arms compared with it, in config order."""
    groups: dict[str, list[str]] = {}
    for name, arm in cfg.reproduce.arms.items():
        if arm.baseline:
            groups.setdefault(arm.baseline, []).append(name)
    return groups


def evaluate_split(cfg: DictConfig, split_name: str, timings: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, SystemOutput]]:
    """Decode, translate with Apertium, score and compare everything on one split."""
    out_dir, ev = Path(cfg.reproduce.out_dir), cfg.eval
    systems: dict[str, SystemOutput] = {}
    split = None
    for name in cfg.reproduce.arms:
        split, systems[name] = decode_run(out_dir / ARMS_DIR / name, split_name, ev, name)
        timings[f"decode {name} {split_name}"] = _timing(systems[name])
    assert split is not None
    if cfg.reproduce.apertium:
        ap = apertium_output(split, out_dir / APERTIUM, cfg.reproduce.apertium_pair)
        if ap is not None:
            systems[APERTIUM] = ap
            timings[f"apertium {split_name}"] = _timing(ap)
    start = time.perf_counter()
    scores = {name: score_system(split, system, ev) for name, system in systems.items()}
    comparisons, trends = {}, {}
    for baseline, arms in _groups(cfg).items():
        members = [baseline, *arms, *([APERTIUM] if APERTIUM in systems else [])]
        comparisons[baseline], all_trends = compare(
            split, {m: systems[m] for m in members}, baseline, ev)
        trends[baseline] = {a: all_trends[a] for a in arms}
    timings[f"scoring {split_name}"] = {"seconds": round(time.perf_counter() - start, 1),
                                        "cached": False}
    result = {"count": len(split.sources), "scores": scores, "comparisons": comparisons,
              "trends": trends}
    return result, systems


def _timing(system: SystemOutput) -> dict[str, Any]:
    return {"seconds": round(system.seconds, 1), "cached": system.cached}


def _command() -> str:
    """The command line that started this run (Hydra's overrides), for the report."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(["seq2seq-reproduce", *HydraConfig.get().overrides.task])
    except ValueError:  # not started by Hydra (tests, the Python API)
        return "seq2seq.reproduce.reproduce_main(cfg)"


# ------------------------------------------------------------------------ main
def reproduce_main(cfg: DictConfig) -> Path:
    """Run (or resume) the whole reproduction; returns the folder holding report.md."""
    started = time.perf_counter()
    out_dir = Path(cfg.reproduce.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out_dir / "reproduce_config.yaml", resolve=True)
    arm_cfgs = arm_configs(cfg)  # fails fast on a bad arm, before the slow phases
    timings: dict[str, Any] = {}
    if cfg.reproduce.build_corpus:
        timings["corpus"] = build_corpus(cfg)
    arms = {}
    for i, (name, arm_cfg) in enumerate(arm_cfgs.items(), 1):
        log.info("arm %d/%d: %s (%s attention)", i, len(arm_cfgs), name,
                 arm_cfg.model.attention.name)
        arms[name] = train_arm(name, arm_cfg)
        arms[name]["spec"] = OmegaConf.to_container(cfg.reproduce.arms[name])
        timings[f"train {name}"] = {"seconds": arms[name]["phase_s"],
                                    "cached": not arms[name]["trained_now"]}
    splits, plot_systems = {}, None
    for split_name in cfg.reproduce.splits:
        splits[split_name], _ = evaluate_split(cfg, split_name, timings)
        if split_name == cfg.reproduce.plot_split:
            plot_systems = splits[split_name]["scores"]
    if plot_systems is not None:
        report.plot_bleu_vs_length(plot_systems, out_dir / "bleu_vs_length.png")
    for split_name, result in splits.items():
        first = next(iter(result["comparisons"].values()), None)
        report.write_results(out_dir, result["scores"], first, None, stem=f"scores_{split_name}")
    results = {
        "profile": cfg.reproduce.profile, "command": _command(),
        "config": OmegaConf.to_container(cfg, resolve=True), "arms": arms, "splits": splits,
        "apertium": _apertium_version(cfg), "timings": timings,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    results["criteria"] = criteria(results)
    (out_dir / "results.json").write_text(
        json.dumps(report.jsonable(results), indent=2, ensure_ascii=False, allow_nan=False) + "\n",
        encoding="utf-8")
    text = render_report(results)
    (out_dir / "report.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"\nreport: {out_dir / 'report.md'}")
    return out_dir


def _apertium_version(cfg: DictConfig) -> str | None:
    from seq2seq import apertium

    return apertium.version() if cfg.reproduce.apertium else None
