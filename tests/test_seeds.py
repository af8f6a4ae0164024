"""Several seeds: mean ± sd per bucket, paired tests pooled across seeds, end to end."""

from __future__ import annotations

import csv
import json
import random

import pytest
from omegaconf import OmegaConf
from test_reproduce import TINY_EVAL, TINY_TRAINING, _write_tiny_corpus, reproduce_cfg

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluation.command import Split, SystemOutput, compare
from seq2seq.experiments import reproduce, seeds

EV = OmegaConf.create({"n_boot": 100, "boot_seed": 3})


# ------------------------------------------------------------------ mean and sd
def test_mean_sd_of_known_numbers() -> None:
    assert seeds.mean_sd([10.0, 12.0, 14.0]) == (12.0, 2.0)  # sample sd, ddof=1
    mean, sd = seeds.mean_sd([1.0, 2.0])
    assert mean == 1.5 and sd == pytest.approx(0.5**0.5)
    assert seeds.mean_sd([5.0]) == (5.0, None)  # one seed has no spread
    with pytest.raises(DataError):
        seeds.mean_sd([])


def _scope(count: int, bleu: float | None, chrf: float | None = None, ratio: float = 1.0):
    if bleu is None:
        return {"count": count, "BLEU": None, "chrF": None, "length_ratio": None,
                "attention_entropy": None}
    return {"count": count, "BLEU": {"score": bleu, "lo": bleu - 1, "hi": bleu + 1},
            "chrF": {"score": chrf if chrf is not None else 2 * bleu, "lo": 0, "hi": 99},
            "length_ratio": ratio, "attention_entropy": None}


def _scores(overall: float, first_bucket: float, ratio: float) -> dict:
    buckets = {label: _scope(0, None) for label in BUCKET_LABELS}
    buckets["1-10"] = _scope(5, first_bucket, ratio=ratio)
    return {"n_boot": 100, "seed": 3, "signatures": {"BLEU": "b", "chrF": "c"},
            "overall": _scope(5, overall, ratio=ratio), "buckets": buckets}


def test_aggregate_scores_gives_mean_sd_and_the_seed_range() -> None:
    agg = seeds.aggregate_scores([_scores(10, 4, 0.9), _scores(12, 6, 1.0),
                                  _scores(14, 8, 1.1)])
    bleu = agg["overall"]["BLEU"]
    assert (bleu["score"], bleu["sd"], bleu["lo"], bleu["hi"]) == (12.0, 2.0, 10, 14)
    assert bleu["per_seed"] == [10, 12, 14]
    assert agg["overall"]["chrF"]["score"] == 24.0 and agg["overall"]["chrF"]["sd"] == 4.0
    first = agg["buckets"]["1-10"]
    assert (first["count"], first["n_seeds"], first["BLEU"]["score"]) == (5, 3, 6.0)
    assert first["length_ratio"] == pytest.approx(1.0)
    assert agg["buckets"]["51+"]["BLEU"] is None and agg["buckets"]["51+"]["count"] == 0
    assert agg["band"] == "min-max over seeds"


def test_aggregate_refuses_seeds_scored_on_other_sentences() -> None:
    other = _scores(12, 6, 1.0)
    other["overall"]["count"] = 7
    with pytest.raises(DataError, match="same split"):
        seeds.aggregate_scores([_scores(10, 4, 0.9), other])


def test_seeds_are_checked() -> None:
    assert seeds.check_seeds([3, 1, 2]) == [3, 1, 2]
    with pytest.raises(ConfigError, match="repeats a seed"):
        seeds.check_seeds([1, 2, 1])


# ------------------------------------------------------------------ pooled tests
WORDS = [f"w{i}" for i in range(200)]


def _split(n: int = 60) -> Split:
    rng = random.Random(5)
    lengths = [5 + (i * 7) % 60 for i in range(n)]
    src = [" ".join(rng.choices(WORDS, k=k)) for k in lengths]
    ref = [" ".join(rng.choices(WORDS, k=k)) for k in lengths]
    return Split("test", src, ref, "fp", "en")


def _out(name: str, hyps: list[str]) -> SystemOutput:
    return SystemOutput(name, hyps, None, None, 1.0, False, "synthetic")


def _cut(split: Split, keep: float, seed: int) -> list[str]:
    """Each reference cut to a fraction of its words, differently per seed."""
    rng = random.Random(seed)
    return [" ".join(r.split()[: max(1, int(len(r.split()) * keep * rng.uniform(0.8, 1.2)))])
            for r in split.references]


def test_stack_seeds_pairs_each_arm_with_its_seeds_baseline() -> None:
    split = _split()
    by_seed = {}
    for seed in (1, 2, 3):
        hyps = _cut(split, 0.5, seed)  # seeds differ; within a seed the arm = its baseline
        by_seed[seed] = {"none": _out("none", hyps), "attn": _out("attn", list(hyps))}
    stacked_split, stacked = seeds.stack_seeds(split, by_seed)
    assert len(stacked_split.sources) == 3 * len(split.sources)
    assert stacked["attn"].hypotheses[len(split.sources):2 * len(split.sources)] == \
        by_seed[2]["attn"].hypotheses
    comparison, _ = compare(stacked_split, stacked, "none", EV)
    tested = comparison["systems"]["attn"]
    assert tested["overall"]["BLEU"]["p_value"] == 1.0  # identical systems: p = 1
    assert tested["overall"]["count"] == 3 * len(split.sources)
    assert all(s["BLEU"]["p_value"] == 1.0 for s in tested["buckets"].values() if s["count"])


def test_pooled_test_finds_a_real_difference() -> None:
    split = _split()
    by_seed = {seed: {"none": _out("none", _cut(split, 0.3, seed)),
                      "attn": _out("attn", _cut(split, 0.9, seed + 10))} for seed in (1, 2)}
    comparison, _ = compare(*seeds.stack_seeds(split, by_seed), "none", EV)
    overall = comparison["systems"]["attn"]["overall"]["BLEU"]
    assert overall["delta"] > 0 and overall["p_value"] < 0.05


def test_stack_seeds_refuses_mismatched_seeds() -> None:
    split = _split(10)
    hyps = list(split.references)
    with pytest.raises(DataError, match="evaluate every seed alike"):
        seeds.stack_seeds(split, {1: {"a": _out("a", hyps)}, 2: {"b": _out("b", hyps)}})
    with pytest.raises(DataError, match="another length"):
        seeds.stack_seeds(split, {1: {"a": _out("a", hyps[:5])}})


# ------------------------------------------------- end to end on a tiny corpus
def test_reproduce_with_two_seeds(tmp_path, monkeypatch) -> None:
    data = _write_tiny_corpus(tmp_path / "corpus")
    overrides = [*data, *TINY_TRAINING, *TINY_EVAL, "~reproduce.arms.luong",
                 "reproduce.seeds=[1,2]", "reproduce.apertium=false",
                 f"reproduce.out_dir={tmp_path / 'out'}"]
    out = reproduce.reproduce_main(reproduce_cfg(*overrides))
    for arm in ("none", "bahdanau"):
        for seed in (1, 2):
            run = out / "arms" / arm / f"seed{seed}"
            assert (run / "summary.json").is_file()
            assert OmegaConf.load(run / "config.yaml").train.seed == seed
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [1, 2] and set(results["per_seed"]) == {"1", "2"}
    test = results["splits"]["test"]
    assert test["count"] == 48 and test["pooled_count"] == 96
    for system in ("none", "bahdanau"):
        per = [results["per_seed"][s]["test"]["scores"][system]["overall"]["BLEU"]["score"]
               for s in ("1", "2")]
        mean = test["scores"][system]["overall"]["BLEU"]
        assert mean["score"] == pytest.approx(sum(per) / 2) and mean["per_seed"] == per
        assert (mean["lo"], mean["hi"]) == (min(per), max(per))
    pooled = test["comparisons"]["none"]["systems"]["bahdanau"]
    assert pooled["overall"]["count"] == 96 and 0 < pooled["overall"]["BLEU"]["p_value"] <= 1
    assert {r["id"] for r in results["criteria"]} == {1, 2, 3, 4}
    text = (out / "report.md").read_text()
    for needle in ("seeds 1, 2", "over seeds: test", "pooled over the seeds",
                   "## Overall BLEU of each seed", "Judged on the seed means", " ± ",
                   "## Criterion 2 per seed", "| bahdanau | 1 |", "| bahdanau | pooled |"):
        assert needle in text, needle
    first = text.split("## What was run")[0]
    assert "bahdanau: the bottleneck" in first and "of 2 seeds" in first
    assert results["curves_png"] == "bleu_by_length_over_time.png"
    with (out / "seeds_test.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * (len(BUCKET_LABELS) + 1) and rows[0]["n_seeds"] == "2"
    assert (out / "scores_test_seed2.csv").is_file()
    assert (out / "bleu_vs_length.png").read_bytes()[:4] == b"\x89PNG"

    import seq2seq.evaluation.command
    import seq2seq.training.loop

    def refuse(*args, **kwargs):
        raise AssertionError("a finished phase ran again")

    monkeypatch.setattr(seq2seq.training.loop, "train_main", refuse)
    monkeypatch.setattr(seq2seq.evaluation.command, "decode", refuse)
    reproduce.reproduce_main(reproduce_cfg(*overrides))  # resumes: nothing is redone
    again = json.loads((out / "results.json").read_text())
    assert again["splits"]["test"]["scores"] == test["scores"]
