"""How the length effect forms during training: dev BLEU by bucket against training time.

Every validation writes dev BLEU per source-length bucket into the run's
``dev_buckets.csv`` (:mod:`seq2seq.training.validation`). This module reads those files for the
arms of a reproduction and draws ``bleu_by_length_over_time.png``:

- one panel per arm: a line per bucket (light = short sources, dark = long), dev BLEU
  against training minutes; with several seeds, the seed mean and a min-max band;
- a last panel: each arm's BLEU on 41+ words divided by its BLEU on 11-20 words. A
  model that keeps its quality on long sentences stays near its early value; the
  fixed-vector bottleneck shows as the ``none`` arm's ratio falling below the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from seq2seq import atomic
from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.evaluation.metrics import LONG_GROUP
from seq2seq.runs.log import read_dev_buckets

SHORT_GROUP = "11-20"  # the short side of criterion 2
Curve = dict[str, np.ndarray]  # "minutes" and one array per bucket label, same length


def read_curve(run_dir: str | Path) -> Curve | None:
    """One run's dev BLEU per bucket at each validation; None when it logged none."""
    rows = read_dev_buckets(run_dir)
    if not rows:
        return None
    steps = sorted({int(r["step"]) for r in rows})
    at = {(int(r["step"]), r["bucket"]): r for r in rows}
    minutes = [float(at[(s, "all")]["elapsed_s"]) / 60 for s in steps]
    curve: Curve = {"minutes": np.array(minutes)}
    for label in (*BUCKET_LABELS, LONG_GROUP, "all"):
        curve[label] = np.array([_num(at.get((s, label), {}).get("bleu")) for s in steps])
    return curve


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def combine_seeds(curves: Sequence[Curve]) -> tuple[Curve, Curve, Curve]:
    """(mean, min, max) over seeds, on the first seed's validation times up to the
    shortest run (each seed interpolated in time; validations fall at other minutes)."""
    if len(curves) == 1:
        return curves[0], curves[0], curves[0]
    end = min(c["minutes"][-1] for c in curves)
    grid = curves[0]["minutes"][curves[0]["minutes"] <= end]
    stacks = {key: np.stack([np.interp(grid, c["minutes"], c[key]) for c in curves])
              for key in curves[0] if key != "minutes"}
    pick = [{"minutes": grid, **{k: getattr(np, f)(v, axis=0) for k, v in stacks.items()}}
            for f in ("mean", "min", "max")]
    return pick[0], pick[1], pick[2]


def long_short_ratio(curve: Curve) -> np.ndarray:
    """BLEU(41+) / BLEU(11-20) at each validation; NaN where the short BLEU is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = curve[LONG_GROUP] / curve[SHORT_GROUP]
    return np.where(np.isfinite(ratio), ratio, np.nan)


def plot_bleu_by_length_over_time(curves: Mapping[str, Sequence[Curve]], path: str | Path,
                                  title: str = "") -> Path | None:
    """Draw the PNG (see the module docstring) for ``curves`` (arm -> one curve per seed).

    Arms without curves are left out; returns None when no arm has one.
    """
    arms = {name: combine_seeds(cs) for name, cs in curves.items() if cs}
    if not arms:
        return None
    n = len(arms) + 1
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(3.6 * cols, 3.2 * rows + 0.9), dpi=130, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = colormaps["viridis_r"](np.linspace(0.15, 0.95, len(BUCKET_LABELS)))
    for ax, (name, (mean, lo, hi)) in zip(axes, arms.items(), strict=False):
        for label, color in zip(BUCKET_LABELS, colors, strict=True):
            ax.plot(mean["minutes"], mean[label], color=color, linewidth=1.6, label=label)
            if lo is not mean:
                ax.fill_between(mean["minutes"], lo[label], hi[label], color=color, alpha=0.15,
                                linewidth=0)
        ax.set_title(name)
        ax.set_xlabel("training minutes")
        ax.set_ylabel("dev BLEU (greedy)")
        ax.grid(True, alpha=0.3)
    top = max(ax.get_ylim()[1] for ax in axes[: len(arms)])
    for ax in axes[: len(arms)]:
        ax.set_ylim(0, top)  # one scale, so the arms compare at a glance
    ratio_ax = axes[len(arms)]
    for name, (mean, lo, hi) in arms.items():
        (line,) = ratio_ax.plot(mean["minutes"], long_short_ratio(mean), marker=".",
                                linewidth=1.8, label=name)
        if lo is not mean:
            both = np.stack([long_short_ratio(lo), long_short_ratio(hi)])
            ratio_ax.fill_between(mean["minutes"], np.nanmin(both, 0), np.nanmax(both, 0),
                                  color=line.get_color(), alpha=0.15, linewidth=0)
    ratio_ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    ratio_ax.set_title(f"BLEU {LONG_GROUP} words / BLEU {SHORT_GROUP}")
    ratio_ax.set_xlabel("training minutes")
    ratio_ax.grid(True, alpha=0.3)
    # below the panel, so it covers no line
    ratio_ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(arms), 3))
    for ax in axes[n:]:
        ax.set_visible(False)
    # the bucket legend sits outside the panels, so it covers no line
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="source words", loc="outside lower center",
               ncol=len(BUCKET_LABELS), fontsize=8)
    fig.suptitle(title or "Dev BLEU by source length during training")
    path = Path(path)
    atomic.save_figure(fig, path)
    return path
