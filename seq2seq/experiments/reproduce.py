"""`seq2seq-reproduce` (`make reproduce`): BLEU versus sentence length, one command.

Builds the corpus if needed, trains every arm of the profile (same data, seed, sizes
and budget; only the attention and, for RNNsearch-30/-50, the length cap differ),
decodes the evaluation splits with each, translates them with Apertium, scores
everything by source-length bucket, runs the paired and ratio-trend tests against
each arm's baseline, judges the criteria (docs/evaluation-protocol.md#the-four-criteria) from the numbers, and writes
into ``reproduce.out_dir``::

    report.md           what was run, tables, criteria with PASS/FAIL, timings
    bleu_vs_length.png  BLEU per bucket, one line per system, 95% CI bands
    bleu_by_length_over_time.png  each arm's dev BLEU per bucket at every validation
    results.json        every number in the report
    scores_<split>.csv  per system x bucket (and .json)
    arms/<name>/        each arm's run folder (checkpoints, logs, eval cache)

With ``reproduce.seeds=[1,2,3]`` every arm is trained once per seed, in
``arms/<name>/seed<k>/``, and each arm x seed is decoded and scored as above
(``scores_<split>_seed<k>.csv``); :mod:`seq2seq.experiments.seeds` then aggregates them: the report,
``seeds_<split>.csv`` and the criteria use the mean ± sd over seeds per bucket and paired
tests pooled across seeds, and the plot's bands span the seeds (min to max).

Interrupted, it resumes: an arm with ``summary.json`` is not trained again, a
half-trained arm resumes from ``last.pt``, decodings come from the eval cache
(keyed by checkpoint content) and Apertium's from ``apertium/``. The arms' configs and
their training are :mod:`seq2seq.experiments.arms`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seq2seq import atomic, runtime
from seq2seq.evaluation import tables as report
from seq2seq.evaluation.command import (
    Split,
    SystemOutput,
    apertium_output,
    compare,
    decode_run,
    score_system,
)
from seq2seq.experiments import curves
from seq2seq.experiments import seeds as seeds_mod
from seq2seq.experiments.arms import arm_configs, arm_dir, train_arms
from seq2seq.experiments.report import criteria, render_report

log = logging.getLogger(__name__)
APERTIUM = "apertium"
CURVES_PNG = "bleu_by_length_over_time.png"


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


def _groups(cfg: DictConfig) -> dict[str, list[str]]:
    """baseline arm -> the arms compared with it, in config order."""
    groups: dict[str, list[str]] = {}
    for name, arm in cfg.reproduce.arms.items():
        if arm.baseline:
            groups.setdefault(arm.baseline, []).append(name)
    return groups


def decode_systems(cfg: DictConfig, split_name: str, timings: dict[str, Any],
                   seed: int | None = None) -> tuple[Split, dict[str, SystemOutput]]:
    """Decode one split with every arm (of ``seed``, if given) and translate it with Apertium."""
    out_dir, ev = Path(cfg.reproduce.out_dir), cfg.eval
    tag = "" if seed is None else f" seed{seed}"
    systems: dict[str, SystemOutput] = {}
    split = None
    runtime.set_threads(ev.threads)  # this command's setting for decoding (eval.threads)
    for name in cfg.reproduce.arms:
        split, systems[name] = decode_run(arm_dir(out_dir, name, seed), split_name, ev, name)
        timings[f"decode {name} {split_name}{tag}"] = _timing(systems[name])
    assert split is not None
    if cfg.reproduce.apertium:
        ap = apertium_output(split, out_dir / APERTIUM, cfg.reproduce.apertium_pair)
        if ap is not None:
            systems[APERTIUM] = ap
            if f"apertium {split_name}" not in timings:  # one translation serves every seed
                timings[f"apertium {split_name}"] = _timing(ap)
    return split, systems


def compare_groups(cfg: DictConfig, split: Split, systems: Mapping[str, SystemOutput]
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Paired tests of each baseline's group (and Apertium), and the ratio-trend tests."""
    comparisons, trends = {}, {}
    for baseline, arms in _groups(cfg).items():
        members = [baseline, *arms, *([APERTIUM] if APERTIUM in systems else [])]
        comparisons[baseline], all_trends = compare(
            split, {m: systems[m] for m in members}, baseline, cfg.eval)
        trends[baseline] = {a: all_trends[a] for a in arms}
    return comparisons, trends


def score_split(cfg: DictConfig, split: Split, systems: Mapping[str, SystemOutput],
                timings: dict[str, Any], label: str) -> dict[str, Any]:
    """Score every system by bucket and compare them (the per-split result of results.json)."""
    start = time.perf_counter()
    scores = {name: score_system(split, system, cfg.eval) for name, system in systems.items()}
    comparisons, trends = compare_groups(cfg, split, systems)
    timings[f"scoring {label}"] = {"seconds": round(time.perf_counter() - start, 1),
                                   "cached": False}
    return {"count": len(split.sources), "scores": scores, "comparisons": comparisons,
            "trends": trends}


def evaluate_split(cfg: DictConfig, split_name: str, timings: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, SystemOutput]]:
    """Decode, translate with Apertium, score and compare everything on one split."""
    split, systems = decode_systems(cfg, split_name, timings)
    return score_split(cfg, split, systems, timings, split_name), systems


def _timing(system: SystemOutput) -> dict[str, Any]:
    return {"seconds": round(system.seconds, 1), "cached": system.cached}


def _command() -> str:
    """The command line that started this run (Hydra's overrides), for the report."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(["seq2seq-reproduce", *HydraConfig.get().overrides.task])
    except ValueError:  # not started by Hydra (tests, the Python API)
        return "seq2seq.experiments.reproduce.reproduce_main(cfg)"


# ------------------------------------------------------------------------ main

def _one_seed(cfg: DictConfig, arm_cfgs: Mapping[str, DictConfig], timings: dict[str, Any]
              ) -> dict[str, Any]:
    """Every arm trained once with ``train.seed`` (``reproduce.seeds=[]``, the default)."""
    out_dir = Path(cfg.reproduce.out_dir)
    arms = train_arms(cfg, arm_cfgs, timings)
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
    return {"arms": arms, "splits": splits}


def _many_seeds(cfg: DictConfig, seeds: list[int], timings: dict[str, Any]) -> dict[str, Any]:
    """Every arm trained once per seed; per-seed results plus their aggregate (seeds.py):
    ``splits`` holds the seed means (criteria and plot read it), ``per_seed`` each seed's."""
    out_dir = Path(cfg.reproduce.out_dir)
    arms: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for name, summary in train_arms(cfg, arm_configs(cfg, seed), timings, seed).items():
            arm = arms.setdefault(name, {"spec": summary.pop("spec"), "per_seed": {}})
            arm.update(attention=summary["attention"], parameters=summary["parameters"])
            arm["per_seed"][seed] = summary
    per_seed: dict[int, dict[str, Any]] = {seed: {} for seed in seeds}
    splits: dict[str, Any] = {}
    for split_name in cfg.reproduce.splits:
        systems_by_seed = {}
        for seed in seeds:
            split, systems_by_seed[seed] = decode_systems(cfg, split_name, timings, seed)
            result = score_split(cfg, split, systems_by_seed[seed], timings,
                                 f"{split_name} seed{seed}")
            per_seed[seed][split_name] = result
            first = next(iter(result["comparisons"].values()), None)
            report.write_results(out_dir, result["scores"], first, None,
                                 stem=f"scores_{split_name}_seed{seed}")
        splits[split_name] = _pooled_split(cfg, split, systems_by_seed, per_seed, timings)
        first = next(iter(splits[split_name]["comparisons"].values()), None)
        seeds_mod.write_seeds_csv(out_dir / f"seeds_{split_name}.csv",
                                  seeds_mod.seeds_rows(splits[split_name]["scores"], first))
    if cfg.reproduce.plot_split in splits:
        report.plot_bleu_vs_length(splits[cfg.reproduce.plot_split]["scores"],
                                   out_dir / "bleu_vs_length.png",
                                   band=f"min-max over seeds {seeds}, line: seed mean")
    return {"seeds": seeds, "arms": arms, "splits": splits, "per_seed": per_seed}


def plot_training_curves(cfg: DictConfig, seeds: list[int]) -> str | None:
    """``bleu_by_length_over_time.png`` from every arm's ``dev_buckets.csv`` (all seeds);
    returns its file name, or None when no arm logged dev BLEU by bucket."""
    out_dir = Path(cfg.reproduce.out_dir)
    runs = {name: [arm_dir(out_dir, name, seed) for seed in (seeds or [None])]
            for name in cfg.reproduce.arms}
    found = {name: [c for c in map(curves.read_curve, dirs) if c is not None]
             for name, dirs in runs.items()}
    tag = f"; seeds {seeds}: line = mean, band = min-max" if len(seeds) > 1 else ""
    path = curves.plot_bleu_by_length_over_time(
        found, out_dir / CURVES_PNG,
        title=f"Dev BLEU by source length during training ({cfg.reproduce.profile} profile{tag})")
    return None if path is None else path.name


def _pooled_split(cfg: DictConfig, split: Split,
                  systems_by_seed: Mapping[int, Mapping[str, SystemOutput]],
                  per_seed: Mapping[int, Mapping[str, Any]], timings: dict[str, Any]
                  ) -> dict[str, Any]:
    """Seed means of the scores, and the paired and trend tests pooled over the seeds."""
    start = time.perf_counter()
    names = list(next(iter(systems_by_seed.values())))
    scores = {name: seeds_mod.aggregate_scores(
        [per_seed[seed][split.name]["scores"][name] for seed in systems_by_seed])
        for name in names}
    stacked_split, stacked = seeds_mod.stack_seeds(split, systems_by_seed)
    comparisons, trends = compare_groups(cfg, stacked_split, stacked)
    timings[f"pooling {split.name}"] = {"seconds": round(time.perf_counter() - start, 1),
                                        "cached": False}
    return {"count": len(split.sources), "pooled_count": len(stacked_split.sources),
            "scores": scores, "comparisons": comparisons, "trends": trends}


def reproduce_main(cfg: DictConfig) -> Path:
    """Run (or resume) the whole reproduction; returns the folder holding report.md."""
    started = time.perf_counter()
    out_dir = Path(cfg.reproduce.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out_dir / "reproduce_config.yaml", resolve=True)
    seeds = seeds_mod.check_seeds(cfg.reproduce.seeds)
    # fails fast on a bad arm, before the slow phases
    arm_cfgs = arm_configs(cfg, seeds[0] if seeds else None)
    timings: dict[str, Any] = {}
    if cfg.reproduce.build_corpus:
        timings["corpus"] = build_corpus(cfg)
    body = _many_seeds(cfg, seeds, timings) if seeds else _one_seed(cfg, arm_cfgs, timings)
    body["curves_png"] = plot_training_curves(cfg, seeds)
    results = {
        "profile": cfg.reproduce.profile, "command": _command(),
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), **body,
        "apertium": _apertium_version(cfg), "timings": timings,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    results["criteria"] = criteria(results)
    atomic.write_json(out_dir / "results.json", report.jsonable(results), indent=2,
                      ensure_ascii=False, allow_nan=False)
    text = render_report(results)
    atomic.write_text(out_dir / "report.md", text)
    print(text)
    print(f"\nreport: {out_dir / 'report.md'}")
    return out_dir


def _apertium_version(cfg: DictConfig) -> str | None:
    from seq2seq.evaluation import apertium

    return apertium.version() if cfg.reproduce.apertium else None
