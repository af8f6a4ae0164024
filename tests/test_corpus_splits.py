"""Splits by group: deterministic, disjoint, stratified test; test_long joining."""

import random

from omegaconf import OmegaConf

from seq2seq.config import DataConfig
from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.corpus.pair import Pair
from seq2seq.corpus.splits import bucket_counts, group_order, join_long, split_pairs


def _cfg(**kw):
    return OmegaConf.structured(DataConfig(name="t", kind="sword", **kw))


def _corpus(n_chapters: int = 300, seed: int = 0) -> list[Pair]:
    """Chapters of 10-30 verses; a few chapters are rich in long verses, as in Kings."""
    rng = random.Random(seed)
    pairs, pos = [], 0
    for c in range(n_chapters):
        long_chapter = c % 25 == 0
        for v in range(rng.randrange(10, 30)):
            n = rng.randrange(40, 70) if long_chapter and v % 2 else rng.randrange(3, 45)
            words = " ".join(["w"] * n)
            pos += 1
            pairs.append(Pair(words, words, f"B.{c}.{v + 1}", f"B.{c}", pos))
        pos += 1  # chapters are not continuous text
    return pairs


def _groups(pairs):
    return {p.group for p in pairs}


def test_splits_are_disjoint_by_group_and_cover_everything() -> None:
    pairs = _corpus()
    splits = split_pairs(pairs, _cfg(test_per_bucket=30, valid_size=300)).splits
    train, valid, test = (_groups(splits[s]) for s in ("train", "valid", "test"))
    assert not train & valid and not train & test and not valid & test
    assert sum(len(s) for s in splits.values()) == len(pairs)
    assert 300 <= len(splits["valid"]) < 300 + 30  # about valid_size, whole chapters


def test_splits_are_identical_across_runs_and_input_order() -> None:
    pairs = _corpus()
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    cfg = _cfg(test_per_bucket=30, valid_size=300)
    a, b = split_pairs(pairs, cfg).splits, split_pairs(shuffled, cfg).splits
    assert all([p.ref for p in a[s]] == [p.ref for p in b[s]] for s in a)
    other_seed = split_pairs(pairs, _cfg(test_per_bucket=30, valid_size=300, split_seed=99)).splits
    assert _groups(other_seed["test"]) != _groups(a["test"])


def test_group_order_is_a_seeded_permutation() -> None:
    groups = [f"B.{i}" for i in range(50)]
    assert group_order(groups, 1) == group_order(reversed(groups), 1)
    assert group_order(groups, 1) != group_order(groups, 2)
    assert sorted(group_order(groups, 1)) == sorted(groups)


def test_test_split_reaches_the_minimum_in_every_bucket() -> None:
    pairs = _corpus()
    natural = bucket_counts(pairs)
    result = split_pairs(pairs, _cfg(test_per_bucket=40, valid_size=200))
    counts = bucket_counts(result.splits["test"])
    assert all(counts[b] >= 40 for b in BUCKET_LABELS), counts
    assert result.shortfall == {}
    # the long buckets were filled on purpose: far above their share of the corpus
    share = counts["51+"] / len(result.splits["test"])
    assert share > 2 * natural["51+"] / len(pairs)


def test_missing_long_segments_are_reported_as_shortfall() -> None:
    short_only = [p for p in _corpus() if p.src_words <= 40]
    result = split_pairs(short_only, _cfg(test_per_bucket=40, valid_size=200))
    assert result.shortfall == {"41-50": 40, "51+": 40}
    # the search stopped instead of pulling the whole corpus into test
    assert len(result.splits["test"]) <= 0.15 * len(short_only)


def test_test_long_joins_consecutive_pairs_within_bounds() -> None:
    pairs = _corpus(40)
    long = join_long(pairs, 60, 120)
    assert long
    by_ref = {p.ref: p for p in pairs}
    for seg in long:
        assert 60 <= seg.src_words <= 120
        first, last = seg.ref.split("-")
        a, b = by_ref[first], by_ref[last]
        assert a.group == b.group == seg.group
        parts = [p for p in pairs if a.pos <= p.pos <= b.pos]
        assert [p.pos for p in parts] == list(range(a.pos, b.pos + 1))  # no gap inside
        assert seg.src == " ".join(p.src for p in parts)


def test_test_long_never_bridges_a_gap() -> None:
    pairs = [Pair(" ".join(["w"] * 35), "x", f"B.1.{i}", "B.1", pos) for i, pos in enumerate([1, 2, 4, 5])]
    long = join_long(pairs, 60, 120)
    assert [seg.ref for seg in long] == ["B.1.0-B.1.1", "B.1.2-B.1.3"]


def test_valid_per_bucket_fills_the_dev_buckets_and_leaves_test_alone() -> None:
    pairs = _corpus()
    plain = split_pairs(pairs, _cfg(test_per_bucket=30, valid_size=200)).splits
    filled = split_pairs(pairs, _cfg(test_per_bucket=30, valid_size=200, valid_per_bucket=25)).splits
    assert [p.ref for p in filled["test"]] == [p.ref for p in plain["test"]]
    assert _groups(plain["valid"]) <= _groups(filled["valid"])  # the random base, then more
    before, after = bucket_counts(plain["valid"]), bucket_counts(filled["valid"])
    assert before["51+"] < 25 <= after["51+"], (before, after)
    assert all(after[b] >= 25 for b in BUCKET_LABELS), after
    assert len(filled["valid"]) <= 0.10 * len(pairs)  # never past the dev cap
    assert not _groups(filled["valid"]) & _groups(filled["train"])
