"""Reports from :mod:`seq2seq.evaluation.metrics` results: JSON/CSV files, markdown tables, the plot.

Inputs are the plain dicts that evaluate returns: ``scores_by_system`` maps a system name
to a :func:`~seq2seq.evaluation.metrics.score_buckets` result, ``comparison`` is a
:func:`~seq2seq.evaluation.significance.paired_test` result and ``trend`` a
:func:`~seq2seq.evaluation.significance.ratio_trend_test` result. Nothing here computes a score.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The object-oriented API draws with Agg without touching pyplot's global backend state.
from matplotlib.figure import Figure

from seq2seq import atomic
from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.errors import DataError
from seq2seq.evaluation.metrics import METRICS

OVERALL = "all"
CSV_FIELDS = (
    "system", "bucket", "count",
    "bleu", "bleu_lo", "bleu_hi", "chrf", "chrf_lo", "chrf_hi",
    "length_ratio", "attention_entropy", "p_bleu", "p_chrf",
)


# ----------------------------------------------------------------------- helpers
def _scopes(scores: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, scope) for every bucket in order, then the overall scope as "all"."""
    return [*scores["buckets"].items(), (OVERALL, scores["overall"])]


def _comparison_scope(
    comparison: Mapping[str, Any] | None, system: str, label: str
) -> Mapping[str, Any] | None:
    """The paired-test scope of ``system`` for bucket ``label`` (or "all"), if there is one."""
    if comparison is None or system not in comparison["systems"]:
        return None
    tested = comparison["systems"][system]
    return tested["overall"] if label == OVERALL else tested["buckets"][label]


def _check_counts(scores_by_system: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Bucket counts shared by all systems; different counts mean different splits."""
    if not scores_by_system:
        raise DataError("no system results to report; score at least one system first")
    counts = None
    for name, scores in scores_by_system.items():
        these = {label: scope["count"] for label, scope in _scopes(scores)}
        if counts is not None and these != counts:
            raise DataError(
                f"system {name!r} has bucket counts {these}, others {counts}: systems were "
                "scored on different splits; score them all on the same split"
            )
        counts = these
    return counts


def jsonable(obj: Any) -> Any:
    """JSON-safe copy: tuples become lists, NaN and infinities become null."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _get(scope: Mapping[str, Any] | None, metric: str, key: str) -> float | None:
    """``scope[metric][key]`` or None where the scope or metric is empty."""
    if scope is None or scope.get(metric) is None:
        return None
    return scope[metric][key]


# ---------------------------------------------------------------------- writers
def csv_rows(
    scores_by_system: Mapping[str, Mapping[str, Any]],
    comparison: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One flat row per system and bucket (plus "all"), with the fields of ``CSV_FIELDS``."""
    rows = []
    for system, scores in scores_by_system.items():
        for label, scope in _scopes(scores):
            paired = _comparison_scope(comparison, system, label)
            rows.append({
                "system": system, "bucket": label, "count": scope["count"],
                "bleu": _get(scope, "BLEU", "score"), "bleu_lo": _get(scope, "BLEU", "lo"),
                "bleu_hi": _get(scope, "BLEU", "hi"), "chrf": _get(scope, "chrF", "score"),
                "chrf_lo": _get(scope, "chrF", "lo"), "chrf_hi": _get(scope, "chrF", "hi"),
                "length_ratio": scope["length_ratio"],
                "attention_entropy": scope["attention_entropy"],
                "p_bleu": _get(paired, "BLEU", "p_value"),
                "p_chrf": _get(paired, "chrF", "p_value"),
            })
    return rows


def write_results(
    out_dir: str | Path,
    scores: Mapping[str, Mapping[str, Any]],
    comparison: Mapping[str, Any] | None = None,
    trend: Mapping[str, Any] | None = None,
    stem: str = "results",
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` (everything) and ``<stem>.csv`` (per system x bucket).

    ``scores`` maps a system name to its ``score_buckets`` result. Returns both paths.
    """
    _check_counts(scores)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"systems": scores, "comparison": comparison, "ratio_trend": trend}
    json_path, csv_path = out / f"{stem}.json", out / f"{stem}.csv"
    atomic.write_json(json_path, jsonable(payload), indent=2, ensure_ascii=False,
                      allow_nan=False)
    _write_csv(csv_path, CSV_FIELDS, csv_rows(scores, comparison))
    return json_path, csv_path


def write_sentence_scores(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write :func:`~seq2seq.evaluation.metrics.sentence_scores` rows as CSV; returns the path."""
    if not rows:
        raise DataError("no sentence scores to write; score a non-empty split first")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_csv(path, tuple(rows[0]), rows)
    return path


def _write_csv(path: Path, fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """CSV with a header; None becomes an empty cell."""
    with atomic.atomic_open(path) as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


# ----------------------------------------------------------------------- markdown
def _fmt(value: float | None, digits: int = 1) -> str:
    """Fixed-point number, or a dash where there is none (empty bucket, undefined ratio)."""
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.3f}" + ("*" if p < 0.05 else "")


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown_table(
    scores_by_system: Mapping[str, Mapping[str, Any]],
    comparison: Mapping[str, Any] | None = None,
) -> str:
    """Per-bucket table: n, then per system BLEU [95% CI], chrF and, with a comparison,
    the paired-bootstrap p-value of BLEU against the baseline; signatures underneath."""
    counts = _check_counts(scores_by_system)
    header = ["Source words", "n"]
    for system in scores_by_system:
        header += [f"{system} BLEU [95% CI]", f"{system} chrF"]
        if _comparison_scope(comparison, system, OVERALL) is not None:
            header.append(f"{system} p")
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for label in (*BUCKET_LABELS, OVERALL):
        cells = [label, str(counts[label])]
        for system, scores in scores_by_system.items():
            scope = scores["overall"] if label == OVERALL else scores["buckets"][label]
            bleu = scope["BLEU"]
            cells.append("—" if bleu is None else
                         f"{bleu['score']:.1f} [{bleu['lo']:.1f}, {bleu['hi']:.1f}]")
            cells.append(_fmt(_get(scope, "chrF", "score")))
            paired = _comparison_scope(comparison, system, OVERALL)
            if paired is not None:
                cells.append(_fmt_p(_get(_comparison_scope(comparison, system, label),
                                         "BLEU", "p_value")))
        lines.append(_md_row(cells))
    first = next(iter(scores_by_system.values()))
    lines.append("")
    lines.append(f"95% CI: bootstrap within each bucket, {first['n_boot']} resamples, "
                 f"seed {first['seed']}.")
    if comparison is not None:
        lines.append(f"p: two-sided paired bootstrap of BLEU against {comparison['baseline']} "
                     f"({comparison['n_boot']} resamples, sacrebleu's statistic); "
                     "* marks p < 0.05.")
    lines += [f"{metric} signature: `{first['signatures'][metric]}`" for metric in METRICS]
    return "\n".join(lines)


def diagnostics_table(scores_by_system: Mapping[str, Mapping[str, Any]]) -> str:
    """Per-bucket output/reference length ratio and mean attention entropy per system."""
    counts = _check_counts(scores_by_system)
    header = ["Source words", "n"]
    for system in scores_by_system:
        header += [f"{system} len ratio", f"{system} attn entropy"]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for label in (*BUCKET_LABELS, OVERALL):
        cells = [label, str(counts[label])]
        for scores in scores_by_system.values():
            scope = scores["overall"] if label == OVERALL else scores["buckets"][label]
            cells += [_fmt(scope["length_ratio"], 3), _fmt(scope["attention_entropy"], 2)]
        lines.append(_md_row(cells))
    return "\n".join(lines)


def trend_summary(trend: Mapping[str, Any]) -> str:
    """One markdown sentence for the ratio-trend test
    (docs/evaluation-protocol.md#criterion-2-the-bottleneck-grows-with-length)."""
    lo, hi = trend["ci"]
    verdict = "significant" if trend["p_value"] < 0.05 else "not significant"
    return (
        f"Attention/none BLEU ratio: {_fmt(trend['ratio_short'], 2)} on {trend['short']} words "
        f"(n={trend['count_short']}), {_fmt(trend['ratio_long'], 2)} on {trend['long']} "
        f"(n={trend['count_long']}); difference {_fmt(trend['diff'], 2)} "
        f"[95% CI {_fmt(lo, 2)}, {_fmt(hi, 2)}], one-sided p = {trend['p_value']:.3f} "
        f"({verdict}, paired bootstrap within each group, {trend['n_boot']} resamples)."
    )


# --------------------------------------------------------------------------- plot
def _line_style(system: str) -> dict[str, Any]:
    """Bahdanau et al.'s Figure 2 styling where the arms carry its names: arms trained
    on pairs up to 30 words dashed, up to 50 solid; RNNsearch blue, RNNencdec red."""
    style: dict[str, Any] = {"marker": "o", "linewidth": 2}
    if system.endswith("-30"):
        style.update(linestyle="--", marker="s")
    if system.startswith("RNNsearch"):
        style["color"] = "tab:blue" if system.endswith("-50") else "tab:cyan"
    elif system.startswith("RNNencdec"):
        style["color"] = "tab:red" if system.endswith("-50") else "tab:orange"
    return style


def plot_bleu_vs_length(
    results_by_system: Mapping[str, Mapping[str, Any]],
    path: str | Path,
    metric: str = "BLEU",
    band: str = "95% bootstrap CI",
) -> Path:
    """PNG of ``metric`` per source-length bucket: one line per system, a shaded band from
    each bucket's ``lo`` to ``hi`` (a 95% CI; :mod:`seq2seq.experiments.seeds` results hold the min and
    max over seeds there, with ``band`` saying so in the title), bucket counts under the x
    labels; empty buckets leave a gap. Returns the path."""
    if metric not in METRICS:
        raise DataError(f"cannot plot metric {metric!r}; choose one of {list(METRICS)}")
    counts = _check_counts(results_by_system)
    x = list(range(len(BUCKET_LABELS)))
    fig = Figure(figsize=(9.5, 5), dpi=150, layout="constrained")
    ax = fig.subplots()
    nan = float("nan")
    for system, scores in results_by_system.items():
        cells = [scores["buckets"][label][metric] for label in BUCKET_LABELS]
        y = [nan if c is None else c["score"] for c in cells]
        lo = [nan if c is None else c["lo"] for c in cells]
        hi = [nan if c is None else c["hi"] for c in cells]
        (line,) = ax.plot(x, y, label=system, **_line_style(system))
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
    ax.set_xticks(x, [f"{label}\n(n={counts[label]})" for label in BUCKET_LABELS])
    ax.set_xlabel("Source sentence length (words)")
    ax.set_ylabel(f"{metric} (corpus, per bucket)")
    ax.set_xlim(-0.4, len(x) - 0.6)
    # A little room below zero so a system at 0 BLEU is not hidden by the axis line.
    ax.set_ylim(bottom=-0.02 * max(ax.get_ylim()[1], 1.0))
    fig.suptitle(f"{metric} by source sentence length (bands: {band})")
    first = next(iter(results_by_system.values()))
    ax.set_title(f"sacrebleu {first['signatures'][metric]}", fontsize=7, color="0.4")
    ax.grid(True, alpha=0.3)
    # outside the axes, so the legend covers no line
    fig.legend(*ax.get_legend_handles_labels(), title="system", loc="outside right upper")
    path = Path(path)
    atomic.save_figure(fig, path)
    return path
