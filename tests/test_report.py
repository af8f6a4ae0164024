"""Report writers: JSON/CSV results, markdown tables and the BLEU-vs-length plot."""

from __future__ import annotations

import csv
import json
import math

import pytest

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.errors import DataError
from seq2seq.evaluation.metrics import score_buckets, sentence_scores
from seq2seq.evaluation.significance import paired_test, ratio_trend_test
from seq2seq.evaluation.tables import (
    CSV_FIELDS,
    diagnostics_table,
    markdown_table,
    plot_bleu_vs_length,
    trend_summary,
    write_results,
    write_sentence_scores,
)

# Two buckets filled (1-10 and 11-20), the other four empty.
SOURCES = [" ".join(["s"] * n) for n in (3, 5, 7, 9, 12, 14, 16, 18)]
REFS = [
    "in the beginning god created the heaven", "and the earth was without form",
    "and god said let there be light", "and there was light",
    "and god saw the light that it was good", "and god divided the light from the darkness",
    "and god called the light day", "and the darkness he called night",
]
GOOD = list(REFS)
BAD = [" ".join(r.split()[:2]) + " zz" for r in REFS]


@pytest.fixture(scope="module")
def results():
    systems = {"none": BAD, "luong": GOOD}
    scores = {
        name: score_buckets(SOURCES, hyps, REFS, n_boot=50, seed=1,
                            entropies=[0.5] * len(SOURCES) if name == "luong" else None)
        for name, hyps in systems.items()
    }
    comparison = paired_test(SOURCES, REFS, systems, baseline="none", n_boot=50, seed=1)
    return scores, comparison


def table_rows(table: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell."""
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_markdown_table_contents(results):
    scores, comparison = results
    table = markdown_table(scores, comparison)
    rows = table_rows(table)
    assert rows["Source words"] == ["n", "none BLEU [95% CI]", "none chrF",
                                    "luong BLEU [95% CI]", "luong chrF", "luong p"]
    assert list(rows)[2:] == [*BUCKET_LABELS, "all"]
    short = scores["luong"]["buckets"]["1-10"]["BLEU"]
    assert rows["1-10"][0] == "4"
    assert rows["1-10"][3] == f"{short['score']:.1f} [{short['lo']:.1f}, {short['hi']:.1f}]"
    assert rows["1-10"][3].startswith("100.0")
    p = comparison["systems"]["luong"]["buckets"]["11-20"]["BLEU"]["p_value"]
    assert rows["11-20"][5] == f"{p:.3f}*"
    assert rows["51+"] == ["0", "—", "—", "—", "—", "—"]
    assert rows["all"][0] == "8"
    assert "paired bootstrap of BLEU against none" in table
    assert f"BLEU signature: `{scores['none']['signatures']['BLEU']}`" in table


def test_markdown_table_without_comparison_has_no_p_column(results):
    scores, _ = results
    rows = table_rows(markdown_table(scores))
    assert rows["Source words"][-1] == "luong chrF"
    assert all(len(cells) == 5 for cells in rows.values())


def test_systems_scored_on_different_splits_are_refused(results):
    scores, _ = results
    other = score_buckets(SOURCES[:4], GOOD[:4], REFS[:4], n_boot=10)
    with pytest.raises(DataError, match="different splits"):
        markdown_table({**scores, "other": other})


def test_diagnostics_table(results):
    scores, _ = results
    rows = table_rows(diagnostics_table(scores))
    assert rows["Source words"][1:] == ["none len ratio", "none attn entropy",
                                        "luong len ratio", "luong attn entropy"]
    assert rows["1-10"][3:] == ["1.000", "0.50"]
    assert rows["1-10"][2] == "—"  # no entropies for `none`
    ratio = scores["none"]["buckets"]["1-10"]["length_ratio"]
    assert rows["1-10"][1] == f"{ratio:.3f}"


def test_write_results_json_and_csv(tmp_path, results):
    scores, comparison = results
    sources = [" ".join(["s"] * n) for n in (12, 15, 45, 47)]
    refs = ["a b c d e f"] * 4
    trend = ratio_trend_test(sources, refs, refs, ["zz"] * 4, n_boot=10)  # NaN ratios
    json_path, csv_path = write_results(tmp_path / "out", scores, comparison, trend)
    loaded = json.loads(json_path.read_text(encoding="utf-8"))
    assert loaded["systems"]["luong"]["buckets"]["51+"]["BLEU"] is None
    assert loaded["comparison"]["baseline"] == "none"
    assert loaded["ratio_trend"]["ratio_short"] is None  # NaN written as null, not NaN
    with csv_path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_FIELDS
    assert len(rows) == 2 * (len(BUCKET_LABELS) + 1)
    row = next(r for r in rows if r["system"] == "luong" and r["bucket"] == "11-20")
    assert float(row["bleu"]) == pytest.approx(scores["luong"]["buckets"]["11-20"]["BLEU"]["score"])
    assert float(row["p_bleu"]) == pytest.approx(
        comparison["systems"]["luong"]["buckets"]["11-20"]["BLEU"]["p_value"])
    empty = next(r for r in rows if r["system"] == "none" and r["bucket"] == "41-50")
    assert empty["count"] == "0" and empty["bleu"] == "" and empty["p_bleu"] == ""


def test_write_sentence_scores(tmp_path):
    path = write_sentence_scores(tmp_path / "s.csv", sentence_scores(SOURCES, BAD, REFS))
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(SOURCES)
    assert rows[4]["bucket"] == "11-20" and rows[4]["src_words"] == "12"
    with pytest.raises(DataError):
        write_sentence_scores(tmp_path / "empty.csv", [])


def test_trend_summary_mentions_the_numbers():
    trend = {"short": "11-20", "long": "41+", "count_short": 150, "count_long": 300,
             "ratio_short": 1.2, "ratio_long": 1.8, "diff": 0.6, "ci": (0.2, 1.1),
             "p_value": 0.004, "n_boot": 1000}
    text = trend_summary(trend)
    assert "1.20 on 11-20" in text and "1.80 on 41+" in text
    assert "[95% CI 0.20, 1.10]" in text and "p = 0.004 (significant" in text
    assert "(not significant" in trend_summary({**trend, "p_value": 0.3})
    assert "— on 11-20" in trend_summary({**trend, "ratio_short": math.nan})


def test_plot_is_written(tmp_path, results):
    scores, _ = results
    path = plot_bleu_vs_length(scores, tmp_path / "plots" / "bleu_vs_length.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert plot_bleu_vs_length(scores, tmp_path / "chrf.png", metric="chrF").exists()
    with pytest.raises(DataError, match="cannot plot"):
        plot_bleu_vs_length(scores, tmp_path / "x.png", metric="TER")
