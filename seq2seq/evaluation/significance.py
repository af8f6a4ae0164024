"""Bootstrap significance tests on detokenized strings: paired system comparison, ratio trend.

Split from :mod:`seq2seq.evaluation.metrics`, whose sufficient statistics, resampling,
intervals, buckets and RNG streams these tests share (see that module's conventions):
:func:`paired_test` is sacrebleu's paired bootstrap of every system against a baseline,
overall and per source-length bucket; :func:`ratio_trend_test` is criterion 2
(docs/evaluation-protocol.md#criterion-2-the-bottleneck-grows-with-length),
whether BLEU(attn)/BLEU(none) grows from short to long sources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.metrics.base import Metric

from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluation.metrics import (
    BUCKET_LABELS,
    Stats,
    _bucket_indices,
    _check_inputs,
    _interval,
    _metrics,
    _range_mask,
    _resample_indices,
    _resampled_scores,
    _scope_rng,
    _score,
    _signatures,
    segment_stats,
    source_length,
)

_TREND_STREAM = 1000  # RNG stream tag for the ratio-trend groups, apart from bucket streams


# ------------------------------------------------------------------- paired tests
def _paired_scope(
    metrics: Mapping[str, Metric], base: Stats, system: Stats, rows: np.ndarray,
    rng: np.random.Generator, n_boot: int,
) -> dict[str, Any]:
    """sacrebleu's paired bootstrap statistic on the sentences ``rows``, per metric.

    As in ``sacrebleu.significance._paired_bs_test``: both systems are scored on the same
    resamples, ``d_i = |sys_i - base_i|`` is centred on its mean and compared with the
    observed ``|sys - base|``; p = (c + 1) / (n_boot + 1). One deliberate difference: c
    counts ``>=`` where sacrebleu counts ``>``. They agree unless a centred difference ties
    the observed one exactly; for identical systems (all zero) sacrebleu 2.6 returns
    1 / (n_boot + 1), calling a system significantly different from itself, and this gives 1.
    """
    if rows.size == 0:
        return {"count": 0, **{name: None for name in metrics}}
    idx = _resample_indices(rows.size, n_boot, rng)
    out: dict[str, Any] = {"count": int(rows.size)}
    for name, metric in metrics.items():
        b, s = base[name][rows], system[name][rows]
        score_b, score_s = _score(metric, b.sum(axis=0)), _score(metric, s.sum(axis=0))
        diffs = np.abs(_resampled_scores(metric, s, idx) - _resampled_scores(metric, b, idx))
        centred = diffs - diffs.mean()
        c = int(np.sum(centred >= abs(score_s - score_b)))
        out[name] = {"score": score_s, "baseline": score_b, "delta": score_s - score_b,
                     "p_value": (c + 1) / (n_boot + 1)}
    return out


def paired_test(
    sources: Sequence[str],
    references: Sequence[str],
    systems: Mapping[str, Sequence[str]],
    baseline: str,
    n_boot: int = 1000,
    seed: int = 12345,
    trg_lang: str = "",
) -> dict[str, Any]:
    """Paired bootstrap of every system against ``baseline``, overall and per bucket.

    Returns ``{"baseline", "n_boot", "seed", "signatures", "systems": {name: {"overall":
    scope, "buckets": {label: scope}}}}`` for every non-baseline system, where a scope is
    ``{"count", "BLEU": {"score", "baseline", "delta", "p_value"}, "chrF": {...}}`` (two-sided
    p-values; ``None`` for empty buckets).
    """
    if baseline not in systems:
        raise ConfigError(
            f"baseline {baseline!r} is not one of the systems {sorted(systems)}; "
            "name one of them as the baseline"
        )
    if len(systems) < 2:
        raise ConfigError("a paired test needs at least two systems; pass another system")
    _check_inputs(sources, references=references, **systems)
    buckets = _bucket_indices(sources)
    metrics = _metrics(trg_lang)
    base = segment_stats(systems[baseline], references, metrics)
    every = np.arange(len(sources))
    results = {}
    for name, hyps in systems.items():
        if name == baseline:
            continue
        stats = segment_stats(hyps, references, metrics)
        results[name] = {
            "overall": _paired_scope(metrics, base, stats, every, _scope_rng(seed, None), n_boot),
            "buckets": {
                label: _paired_scope(metrics, base, stats, np.flatnonzero(buckets == k),
                                     _scope_rng(seed, k), n_boot)
                for k, label in enumerate(BUCKET_LABELS)
            },
        }
    return {"baseline": baseline, "n_boot": n_boot, "seed": seed,
            "signatures": _signatures(metrics, n_boot, seed), "systems": results}


def _bleu_pair(
    bleu: Metric, attn: np.ndarray, none: np.ndarray, rows: np.ndarray,
    rng: np.random.Generator, n_boot: int,
) -> tuple[float, float, float, np.ndarray]:
    """BLEU of attn and none on ``rows``, their ratio, and the ``(n_boot,)`` resampled ratios."""
    a, b = attn[rows], none[rows]
    idx = _resample_indices(rows.size, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = _resampled_scores(bleu, a, idx) / _resampled_scores(bleu, b, idx)
    score_a, score_b = _score(bleu, a.sum(axis=0)), _score(bleu, b.sum(axis=0))
    point = score_a / score_b if score_b > 0 else float("nan")
    return score_a, score_b, point, ratios


def ratio_trend_test(
    sources: Sequence[str],
    references: Sequence[str],
    hyps_attn: Sequence[str],
    hyps_none: Sequence[str],
    long: str = "41+",
    short: str = "11-20",
    n_boot: int = 1000,
    seed: int = 12345,
    trg_lang: str = "",
) -> dict[str, Any]:
    """Criterion 2 (docs/evaluation-protocol.md): is BLEU(attn)/BLEU(none) higher on long sources than on short?

    Each length group is resampled on its own (stratified), with the same indices for both
    systems (paired). ``diff = ratio_long - ratio_short``; the one-sided p-value is the
    bootstrap share of ``diff_i <= 0``, as ``(c + 1) / (n_boot + 1)``; a resample whose
    ratio is undefined (``none`` scores 0) counts against the effect.

    Returns ``{"ratio_short", "ratio_long", "diff", "p_value", "ci": (lo, hi), "short",
    "long", "count_short", "count_long", "bleu_attn_short", "bleu_attn_long",
    "bleu_none_short", "bleu_none_long", "n_boot", "seed"}``; ratios are NaN where ``none`` scores 0 BLEU on the whole group.
    """
    _check_inputs(sources, references=references, hyps_attn=hyps_attn, hyps_none=hyps_none)
    _bucket_indices(sources)  # refuses empty sources like every other entry point
    lengths = np.array([source_length(s) for s in sources])
    bleu = BLEU(trg_lang=trg_lang)
    attn, none = (segment_stats(h, references, {"BLEU": bleu})["BLEU"]
                  for h in (hyps_attn, hyps_none))
    groups = {}
    for k, (role, spec) in enumerate((("short", short), ("long", long))):
        rows = np.flatnonzero(_range_mask(spec, lengths))
        if rows.size == 0:
            raise DataError(f"no source sentence is {spec} words long, so the {role} "
                            "group is empty; choose a range the split covers")
        rng = _scope_rng(seed, _TREND_STREAM + k)
        groups[role] = (rows.size, *_bleu_pair(bleu, attn, none, rows, rng, n_boot))
    (n_s, a_s, b_s, r_s, boot_s), (n_l, a_l, b_l, r_l, boot_l) = groups["short"], groups["long"]
    with np.errstate(invalid="ignore"):
        boot_diff = boot_l - boot_s
    # NaN (0/0 or inf - inf) is neither > 0 nor an interval bound: count it as no effect.
    not_above = int(np.sum(~(boot_diff > 0)))
    lo, hi = _interval(np.where(np.isnan(boot_diff), -np.inf, boot_diff))
    return {
        "short": short, "long": long, "count_short": n_s, "count_long": n_l,
        "bleu_attn_short": a_s, "bleu_attn_long": a_l,
        "bleu_none_short": b_s, "bleu_none_long": b_l,
        "ratio_short": r_s, "ratio_long": r_l, "diff": r_l - r_s,
        "p_value": (not_above + 1) / (n_boot + 1), "ci": (lo, hi),
        "n_boot": n_boot, "seed": seed,
    }
