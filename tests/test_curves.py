"""Dev BLEU by length over training time: reading run folders, combining seeds, the plot."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.experiments import curves
from seq2seq.runs.log import DEV_BUCKET_FIELDS, DEV_BUCKETS


def _write_run(folder: Path, points: list[tuple[int, float, dict[str, float]]]) -> Path:
    """A run folder whose dev_buckets.csv has, per (step, seconds), the given BLEU per label."""
    folder.mkdir(parents=True)
    lines = [",".join(DEV_BUCKET_FIELDS)]
    for step, seconds, bleu in points:
        for label in (*BUCKET_LABELS, "41+", "all"):
            lines.append(f"{step},0,{seconds},{label},10,{bleu.get(label, '')},1.0,1.0")
    (folder / DEV_BUCKETS).write_text("\n".join(lines) + "\n")
    return folder


def _bleu(short: float, long: float) -> dict[str, float]:
    return {**{b: short for b in BUCKET_LABELS[:3]}, **{b: long for b in BUCKET_LABELS[3:]},
            "41+": long, "all": (short + long) / 2}


def test_read_curve_gives_minutes_and_buckets(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "a", [(100, 60.0, _bleu(10, 8)), (200, 150.0, _bleu(20, 10))])
    curve = curves.read_curve(run)
    assert curve["minutes"].tolist() == [1.0, 2.5]
    assert curve["11-20"].tolist() == [10, 20] and curve["41+"].tolist() == [8, 10]
    assert curves.long_short_ratio(curve).tolist() == [0.8, 0.5]
    assert curves.read_curve(tmp_path / "no-such-run") is None


def test_empty_scores_are_nan_not_errors(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "a", [(100, 60.0, {"11-20": 0.0, "all": 1.0})])
    curve = curves.read_curve(run)
    assert math.isnan(curve["51+"][0])
    assert math.isnan(curves.long_short_ratio(curve)[0])  # 0 BLEU on 11-20: undefined


def test_seeds_are_combined_on_a_common_time_grid(tmp_path: Path) -> None:
    a = curves.read_curve(_write_run(tmp_path / "a", [(1, 60.0, _bleu(10, 10)),
                                                       (2, 120.0, _bleu(20, 10)),
                                                       (3, 180.0, _bleu(30, 10))]))
    b = curves.read_curve(_write_run(tmp_path / "b", [(1, 0.0, _bleu(0, 0)),
                                                       (2, 150.0, _bleu(30, 20))]))
    mean, lo, hi = curves.combine_seeds([a, b])
    assert mean["minutes"].tolist() == [1.0, 2.0]  # a's times, up to b's last one
    b_at = np.interp([1.0, 2.0], [0.0, 2.5], [0.0, 30.0])  # b interpolated: 12, 24
    assert mean["11-20"] == pytest.approx((np.array([10, 20]) + b_at) / 2)
    assert lo["11-20"] == pytest.approx(np.minimum([10, 20], b_at))
    assert hi["11-20"] == pytest.approx(np.maximum([10, 20], b_at))


def test_plot_is_written_and_skips_arms_without_curves(tmp_path: Path) -> None:
    a = curves.read_curve(_write_run(tmp_path / "a", [(1, 60.0, _bleu(10, 9)),
                                                       (2, 120.0, _bleu(20, 12))]))
    path = curves.plot_bleu_by_length_over_time({"none": [a, a], "bahdanau": [a], "luong": []},
                                                tmp_path / "out" / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert curves.plot_bleu_by_length_over_time({"none": []}, tmp_path / "d.png") is None
    assert not (tmp_path / "d.png").exists()
