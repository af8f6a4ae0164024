"""Results across training seeds: mean ± standard deviation per bucket, tests pooled over seeds.

``seq2seq-reproduce reproduce.seeds=[1,2,3]`` trains every arm once per seed and scores
each arm × seed exactly as a single run (:func:`seq2seq.evaluation.metrics.score_buckets`). This
module turns those per-seed results into one view:

- :func:`aggregate_scores`: per system, scope (bucket or overall) and metric, the mean and
  the sample standard deviation (``ddof=1``; ``None`` with one seed) of the corpus scores
  of the seeds, their min and max, and each seed's score. The result has the shape of a
  ``score_buckets`` result, with ``lo``/``hi`` holding the **min and max over seeds** (not
  a bootstrap interval), so the criteria of :mod:`seq2seq.experiments.report` and the plot
  read it unchanged; the band of ``bleu_vs_length.png`` therefore spans the seeds.
- :func:`stack_seeds`: the pooled paired test. For seeds ``k = 1..K`` the systems'
  hypotheses are concatenated, seed after seed, into one split of ``K x n`` rows: row
  ``(k, i)`` is sentence ``i`` translated by seed ``k``'s model of every arm (Apertium,
  which has no seed, is repeated). So ``sys_seed_k`` is always paired with
  ``base_seed_k`` on the same sentence, and sacrebleu's paired bootstrap
  (:func:`seq2seq.evaluation.significance.paired_test`, and the ratio-trend test) runs unchanged on the
  stacked sufficient statistics, resampling ``(seed, sentence)`` rows. Its point scores are
  the corpus scores of the pooled sample (close to, not equal to, the seed mean). The
  resampling treats the ``K`` copies of a sentence as independent rows; it captures the
  sentence-sampling noise of the test set averaged over the seeds' models, but does not
  model the between-seed variance separately: read the p-values with the ± sd beside them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluation.command import Split, SystemOutput
from seq2seq.evaluation.metrics import METRICS

OVERALL = "all"
SEEDS_CSV_FIELDS = (
    "system", "bucket", "count", "n_seeds", "bleu_mean", "bleu_sd", "bleu_min", "bleu_max",
    "chrf_mean", "chrf_sd", "chrf_min", "chrf_max", "length_ratio_mean", "p_bleu_pooled",
    "p_chrf_pooled",
)


def check_seeds(seeds: Sequence[int]) -> list[int]:
    """The seeds as a list of distinct integers; ConfigError naming the fix otherwise."""
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"reproduce.seeds={seeds} repeats a seed: list each seed once, "
                          "e.g. reproduce.seeds=[1,2,3]")
    return seeds


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof=1``) of ``values``; sd is None for one."""
    if not values:
        raise DataError("no values to average: score at least one seed")
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), (float(arr.std(ddof=1)) if arr.size > 1 else None)


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else None


def _aggregate_scope(scopes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One bucket (or overall) across seeds; the scopes must have the same count."""
    counts = {s["count"] for s in scopes}
    if len(counts) != 1:
        raise DataError(f"seeds were scored on different sentences (bucket counts {counts}): "
                        "score every seed on the same split")
    out: dict[str, Any] = {"count": scopes[0]["count"], "n_seeds": len(scopes)}
    for metric in METRICS:
        if any(s[metric] is None for s in scopes):
            out[metric] = None
            continue
        values = [s[metric]["score"] for s in scopes]
        mean, sd = mean_sd(values)
        out[metric] = {"score": mean, "sd": sd, "lo": min(values), "hi": max(values),
                       "per_seed": values}
    out["length_ratio"] = _mean_or_none([s["length_ratio"] for s in scopes])
    out["attention_entropy"] = _mean_or_none([s["attention_entropy"] for s in scopes])
    return out


def aggregate_scores(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean ± sd across seeds of one system's :func:`~seq2seq.evaluation.metrics.score_buckets` results.

    Returns the ``score_buckets`` shape (``"overall"``, ``"buckets"``, ``"signatures"``,
    ``"n_boot"``, ``"seed"``) where each metric is ``{"score": mean, "sd", "lo": min,
    "hi": max, "per_seed": [score of each seed]}`` and each scope also has ``n_seeds``;
    length ratio and attention entropy are seed means. ``"band": "min-max over seeds"``.
    """
    if not per_seed:
        raise DataError("no seeds to aggregate: score at least one seed")
    first = per_seed[0]
    return {
        "n_boot": first["n_boot"], "seed": first["seed"], "signatures": first["signatures"],
        "band": "min-max over seeds", "n_seeds": len(per_seed),
        "overall": _aggregate_scope([s["overall"] for s in per_seed]),
        "buckets": {label: _aggregate_scope([s["buckets"][label] for s in per_seed])
                    for label in BUCKET_LABELS},
    }


def stack_seeds(split: Split, systems_by_seed: Mapping[int, Mapping[str, SystemOutput]]
                ) -> tuple[Split, dict[str, SystemOutput]]:
    """One split of ``K x n`` rows and every system's hypotheses stacked in the same order.

    ``systems_by_seed`` maps each seed to ``{system: its output on split}``; every seed must
    have the same systems. Row ``k * n + i`` is sentence ``i`` under the ``k``-th seed (see
    the module docstring for why this pairs each arm with its baseline of the same seed).
    """
    seeds = list(systems_by_seed)
    if not seeds:
        raise DataError("no seeds to pool: score at least one seed")
    names = list(systems_by_seed[seeds[0]])
    for seed in seeds:
        if list(systems_by_seed[seed]) != names:
            raise DataError(f"seed {seed} has systems {list(systems_by_seed[seed])}, "
                            f"seed {seeds[0]} has {names}: evaluate every seed alike")
    n = len(split.sources)
    stacked_split = replace(split, sources=split.sources * len(seeds),
                            references=split.references * len(seeds),
                            fingerprint=f"{split.fingerprint}-seeds-{'-'.join(map(str, seeds))}")
    stacked: dict[str, SystemOutput] = {}
    for name in names:
        outs = [systems_by_seed[seed][name] for seed in seeds]
        if any(len(o.hypotheses) != n for o in outs):
            raise DataError(f"{name} has a decoding of another length than the {n} sentences "
                            f"of {split.name}: decode every seed on the same split")
        hyps = [h for o in outs for h in o.hypotheses]
        ents = (None if any(o.entropies is None for o in outs)
                else [e for o in outs for e in o.entropies])
        stacked[name] = replace(outs[0], hypotheses=hyps, entropies=ents, lengths=None,
                                seconds=sum(o.seconds for o in outs),
                                cached=all(o.cached for o in outs))
    return stacked_split, stacked


# ------------------------------------------------------------------------ rows
def _paired_scope(comparison: Mapping[str, Any] | None, system: str, label: str
                  ) -> Mapping[str, Any] | None:
    if comparison is None or system not in comparison["systems"]:
        return None
    tested = comparison["systems"][system]
    return tested["overall"] if label == OVERALL else tested["buckets"][label]


def _p(scope: Mapping[str, Any] | None, metric: str) -> float | None:
    return None if scope is None or scope.get(metric) is None else scope[metric]["p_value"]


def seeds_rows(scores: Mapping[str, Mapping[str, Any]],
               comparison: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Flat rows (fields ``SEEDS_CSV_FIELDS``) per system and bucket (then "all") of
    :func:`aggregate_scores` results, with the pooled paired p-values of ``comparison``."""
    rows = []
    for system, agg in scores.items():
        for label, scope in [*agg["buckets"].items(), (OVERALL, agg["overall"])]:
            row: dict[str, Any] = {"system": system, "bucket": label, "count": scope["count"],
                                   "n_seeds": scope["n_seeds"]}
            for metric, key in (("BLEU", "bleu"), ("chrF", "chrf")):
                m = scope[metric] or {}
                row.update({f"{key}_mean": m.get("score"), f"{key}_sd": m.get("sd"),
                            f"{key}_min": m.get("lo"), f"{key}_max": m.get("hi")})
            paired = _paired_scope(comparison, system, label)
            row.update({"length_ratio_mean": scope["length_ratio"],
                        "p_bleu_pooled": _p(paired, "BLEU"), "p_chrf_pooled": _p(paired, "chrF")})
            rows.append(row)
    return rows


def write_seeds_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write :func:`seeds_rows` as CSV (None becomes an empty cell); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(SEEDS_CSV_FIELDS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path
