"""Dev scores by source-length bucket: the scorer, the dev sample, and what training logs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.errors import DataError
from seq2seq.evaluation.metrics import quick_bucket_scores
from seq2seq.runs.log import read_dev_buckets
from seq2seq.training.validation import bleu_sample


def _toy(n: int, seed: int) -> tuple[list[int], list[str], list[str]]:
    rng = np.random.default_rng(seed)
    words = ["the", "king", "said", "unto", "him", "and", "land", "of", "god", "lord"]
    lengths, hyps, refs = [], [], []
    for _ in range(n):
        k = int(rng.integers(1, 70))
        ref = [words[i] for i in rng.integers(0, len(words), k)]
        hyp = [w if rng.random() < 0.7 else "x" for w in ref[: max(1, k - int(rng.integers(0, 4)))]]
        lengths.append(k)
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp))
    return lengths, hyps, refs


def test_quick_bucket_scores_equal_sacrebleu_on_each_bucket() -> None:
    lengths, hyps, refs = _toy(300, 1)
    rows = {r["bucket"]: r for r in quick_bucket_scores(lengths, hyps, refs)}
    assert list(rows) == [*BUCKET_LABELS, "41+", "all"]
    groups = {label: [] for label in rows}
    for i, n in enumerate(lengths):
        label = BUCKET_LABELS[min((n - 1) // 10, 5)]
        groups[label].append(i)
        groups["all"].append(i)
        if n >= 41:
            groups["41+"].append(i)
    for label, rows_i in groups.items():
        h, r = [hyps[i] for i in rows_i], [refs[i] for i in rows_i]
        assert rows[label]["count"] == len(rows_i)
        assert rows[label]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(h, [r]).score, abs=1e-9)
        assert rows[label]["chrf"] == pytest.approx(sacrebleu.corpus_chrf(h, [r]).score, abs=1e-9)
        bleu = sacrebleu.corpus_bleu(h, [r])
        assert rows[label]["length_ratio"] == pytest.approx(bleu.sys_len / bleu.ref_len)


def test_quick_bucket_scores_empty_bucket_is_nan_and_empty_source_refused() -> None:
    rows = {r["bucket"]: r for r in quick_bucket_scores([3, 5], ["a b c", "d e"], ["a b c", "d e f"])}
    assert rows["1-10"]["count"] == 2 and rows["51+"]["count"] == 0
    assert math.isnan(rows["51+"]["bleu"]) and math.isnan(rows["41+"]["length_ratio"])
    with pytest.raises(DataError, match="0 words"):
        quick_bucket_scores([0, 5], ["a", "b"], ["a", "b"])


def test_bleu_sample_spreads_over_dev_and_takes_all_when_asked() -> None:
    idx = np.arange(100, 1100)
    sample = bleu_sample(idx, 10)
    assert len(sample) == 10 and sample[0] == 100 and sample[-1] == 1099
    assert np.all(np.diff(sample) > 90)  # spread, not the first ten
    assert np.array_equal(bleu_sample(idx, 5000), idx)


def test_training_logs_dev_buckets_and_resume_drops_later_rows(tiny_train_overrides,
                                                                tmp_path: Path) -> None:
    from test_train import train

    run_dir = tmp_path / "run"
    args = (*tiny_train_overrides, f"run_dir={run_dir}", "train.valid_bleu_sentences=1000")
    train(list(args), "train.max_steps=5")
    step5 = (run_dir / "last.pt").read_bytes()
    train(list(args), "train.max_steps=10", "train.resume=true")
    rows = read_dev_buckets(run_dir)
    assert sorted({int(r["step"]) for r in rows}) == [5, 10]
    first = [r for r in rows if r["step"] == "5"]
    assert [r["bucket"] for r in first] == [*BUCKET_LABELS, "41+", "all"]
    by = {r["bucket"]: r for r in first}
    assert int(by["all"]["count"]) == 40  # the whole tiny dev
    assert sum(int(by[b]["count"]) for b in BUCKET_LABELS) == 40
    assert int(by["1-10"]["count"]) > 0 and float(by["all"]["elapsed_s"]) > 0
    assert "dev BLEU by source words" in (run_dir / "train.log").read_text()

    # back to the step-5 checkpoint: the step-10 rows are dropped, then logged once again
    (run_dir / "last.pt").write_bytes(step5)
    train(list(args), "train.max_steps=10", "train.resume=true")
    again = read_dev_buckets(run_dir)
    assert [int(r["step"]) for r in again] == [5] * len(first) + [10] * len(first)
    assert again[-1]["bleu"] == rows[-1]["bleu"]  # resume is exact, so is the score


def test_dev_bleu_off_writes_no_bucket_rows(tiny_train_overrides, tmp_path: Path) -> None:
    from test_train import train

    run_dir = tmp_path / "run"
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=5",
          "train.valid_bleu_sentences=0")
    assert read_dev_buckets(run_dir) == []
