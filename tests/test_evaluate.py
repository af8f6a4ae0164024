"""Scoring by length bucket, bootstrap intervals, paired tests and the ratio-trend test."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from seq2seq.corpus.buckets import BUCKET_LABELS, bucket_label, bucket_of
from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluation.metrics import score_buckets, sentence_scores
from seq2seq.evaluation.significance import paired_test, ratio_trend_test

VOCAB = [f"w{i}" for i in range(300)] + ["the", "and", "of", "unto", "he", "said"]
RANGES = [(1, 10), (11, 20), (21, 30), (31, 40), (41, 50), (51, 70)]


def make_split(per_bucket: int = 30, seed: int = 0) -> tuple[list[str], list[str]]:
    """Sources spread over all six buckets and references of about the same length."""
    rnd = random.Random(seed)
    sources, refs = [], []
    for lo, hi in RANGES:
        for _ in range(per_bucket):
            n = rnd.randint(lo, hi)
            sources.append(" ".join(rnd.choices(VOCAB, k=n)))
            refs.append(" ".join(rnd.choices(VOCAB, k=max(1, round(n * 1.1)))) + ".")
    return sources, refs


def corrupt(sources, refs, rate_of_len, seed: int) -> list[str]:
    """A 'system': the reference with a share of words replaced, the share set by length."""
    rnd = random.Random(seed)
    out = []
    for src, ref in zip(sources, refs, strict=True):
        rate = rate_of_len(len(src.split()))
        out.append(" ".join("zz" if rnd.random() < rate else w for w in ref.split()))
    return out


@pytest.fixture(scope="module")
def split():
    sources, refs = make_split()
    return sources, refs, corrupt(sources, refs, lambda n: 0.3, seed=1)


# ------------------------------------------------------------------- bucketing
@pytest.mark.parametrize(
    ("n_words", "label"),
    [(1, "1-10"), (10, "1-10"), (11, "11-20"), (20, "11-20"), (21, "21-30"), (40, "31-40"),
     (41, "41-50"), (50, "41-50"), (51, "51+"), (10**6, "51+")],
)
def test_bucket_boundaries(n_words, label):
    assert bucket_label(n_words) == label


def test_bucket_of_counts_whitespace_words():
    assert bucket_of("  uno\tdos \n tres ") == "1-10"
    assert bucket_of(" ".join(["x"] * 11)) == "11-20"
    assert bucket_of(" ".join(["x"] * 51)) == "51+"


@pytest.mark.parametrize("bad", [0, -3])
def test_zero_words_is_refused(bad):
    with pytest.raises(DataError, match="empty"):
        bucket_label(bad)


def test_empty_source_in_a_split_is_refused_with_its_index(split):
    sources, refs, hyps = split
    sources = list(sources)
    sources[7] = "   "
    with pytest.raises(DataError, match="source sentence 7"):
        score_buckets(sources, hyps, refs, n_boot=10)


def test_empty_buckets_have_count_zero_and_no_score():
    sources = ["a b c", "d e f g h i j k l m n o"]  # 3 and 12 words
    refs = ["the cat sat", "the dog sat on the mat today"]
    res = score_buckets(sources, refs, refs, n_boot=20)
    assert res["buckets"]["1-10"]["count"] == 1
    assert res["buckets"]["11-20"]["count"] == 1
    for label in ("21-30", "31-40", "41-50", "51+"):
        assert res["buckets"][label] == {"count": 0, "BLEU": None, "chrF": None,
                                         "length_ratio": None, "attention_entropy": None}
    assert list(res["buckets"]) == list(BUCKET_LABELS)
    assert res["overall"]["count"] == 2


# ------------------------------------------------------------- scores and CIs
def test_bucket_scores_equal_sacrebleu_on_the_subset(split):
    sources, refs, hyps = split
    res = score_buckets(sources, hyps, refs, n_boot=10)
    for label in BUCKET_LABELS:
        rows = [i for i, s in enumerate(sources) if bucket_of(s) == label]
        sub_h, sub_r = [hyps[i] for i in rows], [[refs[i] for i in rows]]
        got = res["buckets"][label]
        assert got["count"] == len(rows) == 30
        assert got["BLEU"]["score"] == pytest.approx(BLEU().corpus_score(sub_h, sub_r).score)
        assert got["chrF"]["score"] == pytest.approx(CHRF().corpus_score(sub_h, sub_r).score)
    assert res["overall"]["BLEU"]["score"] == pytest.approx(
        BLEU().corpus_score(hyps, [refs]).score)
    assert res["signatures"]["BLEU"].startswith("nrefs:1|bs:10|seed:12345|")
    assert "tok:13a" in res["signatures"]["BLEU"]


def test_overall_interval_is_sacrebleus_own_bootstrap(split, monkeypatch):
    """Same draws as sacrebleu's corpus_score(n_bootstrap): its ± half-width equals ours."""
    sources, refs, hyps = split
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    for metric, name in ((BLEU(), "BLEU"), (CHRF(), "chrF")):
        theirs = metric.corpus_score(hyps, [refs], n_bootstrap=300)
        ours = score_buckets(sources, hyps, refs, n_boot=300, seed=12345)["overall"][name]
        assert (ours["hi"] - ours["lo"]) / 2 == pytest.approx(theirs._ci, rel=1e-5)


def test_fixed_seed_fixed_intervals_other_seed_different(split):
    sources, refs, hyps = split
    a = score_buckets(sources, hyps, refs, n_boot=100, seed=7)
    b = score_buckets(sources, hyps, refs, n_boot=100, seed=7)
    c = score_buckets(sources, hyps, refs, n_boot=100, seed=8)
    assert a == b
    assert a["buckets"]["21-30"]["BLEU"]["score"] == c["buckets"]["21-30"]["BLEU"]["score"]
    for label in BUCKET_LABELS:
        assert (a["buckets"][label]["BLEU"]["lo"], a["buckets"][label]["BLEU"]["hi"]) != (
            c["buckets"][label]["BLEU"]["lo"], c["buckets"][label]["BLEU"]["hi"])


def test_interval_contains_point_estimate(split):
    sources, refs, hyps = split
    res = score_buckets(sources, hyps, refs, n_boot=200)
    for scope in [res["overall"], *res["buckets"].values()]:
        for name in ("BLEU", "chrF"):
            cell = scope[name]
            assert cell["lo"] < cell["score"] < cell["hi"], (name, cell)


def test_diagnostics_length_ratio_and_entropy():
    sources = ["a b", "c d e", " ".join(["x"] * 15)]
    refs = ["one two three four", "five six", "seven eight nine ten"]
    hyps = ["one two", "five six", "seven eight nine ten eleven twelve"]
    res = score_buckets(sources, hyps, refs, n_boot=10, entropies=[1.0, 2.0, 5.0])
    short = res["buckets"]["1-10"]
    assert short["length_ratio"] == pytest.approx((2 + 2) / (4 + 2))
    assert short["attention_entropy"] == pytest.approx(1.5)
    assert res["buckets"]["11-20"]["length_ratio"] == pytest.approx(6 / 4)
    assert res["overall"]["attention_entropy"] == pytest.approx(8 / 3)
    assert score_buckets(sources, hyps, refs, n_boot=10)["overall"]["attention_entropy"] is None


def test_sentence_scores_match_sacrebleu_sentence_score(split):
    sources, refs, hyps = split
    rows = sentence_scores(sources, hyps, refs)
    bleu, chrf = BLEU(effective_order=True), CHRF()
    for i in (0, 45, 179):
        assert rows[i]["index"] == i
        assert rows[i]["bucket"] == bucket_of(sources[i])
        assert rows[i]["bleu"] == pytest.approx(bleu.sentence_score(hyps[i], [refs[i]]).score)
        assert rows[i]["chrf"] == pytest.approx(chrf.sentence_score(hyps[i], [refs[i]]).score)
    assert sentence_scores(["a"], ["the cat"], ["the cat"])[0]["bleu"] == pytest.approx(100)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"hypotheses": ["x"]}, DataError, "hypotheses has 1 lines"),
        ({"references": None}, DataError, "empty"),
        ({"entropies": [0.1]}, DataError, "entropies"),
        ({"n_boot": 0}, ConfigError, "n_boot"),
    ],
)
def test_bad_input_gives_clear_errors(kwargs, error, message):
    args = {"sources": ["a b", "c"], "hypotheses": ["x y", "z"], "references": ["x y", "z"]}
    if kwargs.get("references", "") is None:
        args = {"sources": [], "hypotheses": [], "references": []}
        kwargs = {}
    with pytest.raises(error, match=message):
        score_buckets(**{**args, **kwargs})


def test_non_string_hypothesis_is_refused():
    with pytest.raises(DataError, match="hypotheses line 1 is NoneType"):
        score_buckets(["a", "b"], ["x", None], ["x", "y"], n_boot=5)


# --------------------------------------------------------------- paired tests
def test_identical_systems_give_p_one(split):
    sources, refs, hyps = split
    res = paired_test(sources, refs, {"a": hyps, "b": list(hyps)}, baseline="a", n_boot=200)
    for scope in [res["systems"]["b"]["overall"], *res["systems"]["b"]["buckets"].values()]:
        assert scope["BLEU"]["p_value"] == 1.0
        assert scope["chrF"]["p_value"] == 1.0
        assert scope["BLEU"]["delta"] == 0.0


def test_sacrebleu_itself_calls_identical_systems_significant(split, monkeypatch):
    """Why we count ties: sacrebleu 2.6 gives 1/(n+1) here. If this starts failing,
    sacrebleu changed its convention and paired_test's docstring needs revisiting."""
    sources, refs, hyps = split
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    _, res = PairedTest([("a", hyps), ("b", list(hyps))], {"BLEU": BLEU()}, [refs],
                        test_type="bs", n_samples=200)()
    assert res["BLEU"][1].p_value == pytest.approx(1 / 201)


def test_paired_p_value_equals_sacrebleus_for_different_systems(split, monkeypatch):
    sources, refs, hyps = split
    other = corrupt(sources, refs, lambda n: 0.33, seed=2)
    monkeypatch.setenv("SACREBLEU_SEED", "321")
    _, theirs = PairedTest([("a", hyps), ("b", other)], {"BLEU": BLEU(), "chrF": CHRF()},
                           [refs], test_type="bs", n_samples=300)()
    ours = paired_test(sources, refs, {"a": hyps, "b": other}, "a", n_boot=300, seed=321)
    overall = ours["systems"]["b"]["overall"]
    assert overall["BLEU"]["p_value"] == pytest.approx(theirs["BLEU"][1].p_value)
    assert overall["chrF"]["p_value"] == pytest.approx(theirs["chrF2"][1].p_value)
    assert overall["BLEU"]["score"] == pytest.approx(theirs["BLEU"][1].score)


def test_clearly_better_system_is_significant_per_bucket(split):
    sources, refs, weak = split
    strong = corrupt(sources, refs, lambda n: 0.05, seed=3)
    res = paired_test(sources, refs, {"weak": weak, "strong": strong}, "weak", n_boot=200)
    assert res["baseline"] == "weak" and "weak" not in res["systems"]
    tested = res["systems"]["strong"]
    assert tested["overall"]["BLEU"]["p_value"] < 0.05
    for label in BUCKET_LABELS:
        cell = tested["buckets"][label]
        assert cell["count"] == 30
        assert cell["BLEU"]["delta"] > 0
        assert cell["BLEU"]["p_value"] < 0.05


def test_paired_test_empty_bucket_and_bad_baseline():
    sources = ["a b c", "d e f"]
    refs = ["the cat sat", "a dog ran"]
    res = paired_test(sources, refs, {"x": refs, "y": ["the cat", "a dog"]}, "x", n_boot=20)
    assert res["systems"]["y"]["buckets"]["51+"] == {"count": 0, "BLEU": None, "chrF": None}
    with pytest.raises(ConfigError, match="baseline 'z'"):
        paired_test(sources, refs, {"x": refs, "y": refs}, "z")
    with pytest.raises(ConfigError, match="at least two"):
        paired_test(sources, refs, {"x": refs}, "x")


# ------------------------------------------------------------ ratio trend
@pytest.fixture(scope="module")
def trend_split():
    return make_split(per_bucket=40, seed=5)


def test_ratio_trend_detects_a_bottleneck(trend_split):
    sources, refs = trend_split
    attn = corrupt(sources, refs, lambda n: 0.25, seed=11)
    none = corrupt(sources, refs, lambda n: min(0.85, 0.1 + n / 60), seed=12)
    res = ratio_trend_test(sources, refs, attn, none, n_boot=300)
    assert res["count_short"] == 40 and res["count_long"] == 80  # 41-50 and 51+
    assert res["ratio_long"] > res["ratio_short"] > 0
    assert res["diff"] == pytest.approx(res["ratio_long"] - res["ratio_short"])
    assert res["p_value"] < 0.05
    assert 0 < res["ci"][0] < res["diff"] < res["ci"][1]


def test_ratio_trend_without_effect_is_not_significant(trend_split):
    sources, refs = trend_split
    # Both systems lose quality at the same rate with length: the ratio stays put.
    attn = corrupt(sources, refs, lambda n: 0.2 + n / 400, seed=21)
    none = corrupt(sources, refs, lambda n: 0.3 + n / 300, seed=22)
    res = ratio_trend_test(sources, refs, attn, none, n_boot=300)
    assert res["p_value"] > 0.05
    assert res["ci"][0] < 0
    same = ratio_trend_test(sources, refs, attn, list(attn), n_boot=100)
    assert same["ratio_short"] == same["ratio_long"] == 1.0
    assert same["p_value"] == 1.0


def test_ratio_trend_reverse_effect_has_large_p(trend_split):
    sources, refs = trend_split
    attn = corrupt(sources, refs, lambda n: min(0.85, 0.1 + n / 60), seed=31)
    none = corrupt(sources, refs, lambda n: 0.25, seed=32)
    assert ratio_trend_test(sources, refs, attn, none, n_boot=200)["p_value"] > 0.95


def test_ratio_trend_fixed_seed_and_bad_ranges(trend_split):
    sources, refs = trend_split
    attn = corrupt(sources, refs, lambda n: 0.2, seed=41)
    none = corrupt(sources, refs, lambda n: 0.4, seed=42)
    a = ratio_trend_test(sources, refs, attn, none, n_boot=100, seed=3)
    assert a == ratio_trend_test(sources, refs, attn, none, n_boot=100, seed=3)
    assert a["ci"] != ratio_trend_test(sources, refs, attn, none, n_boot=100, seed=4)["ci"]
    custom = ratio_trend_test(sources, refs, attn, none, long="51-70", short="1-10", n_boot=20)
    assert custom["count_long"] == 40 and custom["count_short"] == 40
    with pytest.raises(ConfigError, match="not understood"):
        ratio_trend_test(sources, refs, attn, none, long="long", n_boot=10)
    with pytest.raises(DataError, match="group is empty"):
        ratio_trend_test(sources, refs, attn, none, long="500+", n_boot=10)


def test_ratio_trend_survives_a_zero_bleu_baseline():
    sources = [" ".join(["s"] * n) for n in (12, 15, 18, 45, 47, 60)]
    refs = ["the cat sat on the mat"] * 6
    attn = ["the cat sat on the mat"] * 6
    none = ["zz"] * 6
    res = ratio_trend_test(sources, refs, attn, none, n_boot=50)
    assert np.isnan(res["ratio_short"]) and np.isnan(res["ratio_long"])
    assert res["bleu_none_short"] == 0.0
    assert res["p_value"] == 1.0
