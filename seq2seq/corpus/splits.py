"""Deterministic splits by group (chapter, block of lines) and the length-stratified test.

Every group goes to exactly one split, so no chapter is seen in training and tested.
Order comes from a seeded SHA-256 of the group id (Python's ``hash()`` is salted per
process), so the split is the same on every machine.

Test: a random base of groups, then, while a source-length bucket has fewer than
``test_per_bucket`` segments, the group that fills most of the missing counts is
added (ties broken by the seeded order). ``test_long`` joins consecutive test segments
of one group into 60-120-word segments, longer than anything the models train on.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from seq2seq.corpus.buckets import BUCKET_LABELS, BUCKETS, bucket_label
from seq2seq.corpus.pair import Pair, ref_bounds

TEST_BASE_SHARE = 0.5  # random base of the test set, as a share of the bucket minimums
MAX_TEST_SHARE = 0.15  # the stratified test never takes more than this share of the pairs
MAX_VALID_SHARE = 0.10


def bucket_counts(pairs: Iterable[Pair]) -> dict[str, int]:
    counts = Counter(bucket_label(p.src_words) for p in pairs)
    return {label: counts.get(label, 0) for label in BUCKET_LABELS}


def group_order(groups: Iterable[str], seed: int) -> list[str]:
    """Groups sorted by a seeded SHA-256 of their id: a machine-independent shuffle."""

    def key(group: str) -> str:
        return hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()

    return sorted(set(groups), key=key)


@dataclass
class SplitResult:
    splits: dict[str, list[Pair]]
    shortfall: dict[str, int] = field(default_factory=dict)  # bucket -> segments missing


def _by_group(pairs: Sequence[Pair]) -> dict[str, list[Pair]]:
    groups: dict[str, list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(pair.group, []).append(pair)
    return groups


def _choose_stratified(
    groups: dict[str, list[Pair]], order: list[str], per_bucket: int, cap: int, base: int,
    base_capped: bool = False,
) -> list[str]:
    """Groups for a held-out split: a random base of ``base`` pairs (with ``base_capped``,
    never past ``cap``), then greedy filling of the buckets still short of ``per_bucket``
    segments, up to ``cap`` pairs."""
    chosen: list[str] = []
    size = 0
    for group in order:
        if size >= base or (base_capped and size + len(groups[group]) > max(cap, 1)):
            break
        chosen.append(group)
        size += len(groups[group])
    have = Counter(bucket_label(p.src_words) for g in chosen for p in groups[g])
    counts = {g: Counter(bucket_label(p.src_words) for p in groups[g]) for g in order}
    rank = {g: i for i, g in enumerate(order)}
    remaining = [g for g in order if g not in set(chosen)]
    while remaining:
        deficit = {b: per_bucket - have[b] for b in BUCKET_LABELS if have[b] < per_bucket}
        if not deficit:
            break
        best = max(
            remaining,
            key=lambda g: (sum(min(counts[g][b], d) for b, d in deficit.items()), -rank[g]),
        )
        gain = sum(min(counts[best][b], d) for b, d in deficit.items())
        if gain == 0 or size + len(groups[best]) > cap:
            break
        chosen.append(best)
        remaining.remove(best)
        size += len(groups[best])
        have.update(counts[best])
    return chosen


def split_pairs(pairs: Sequence[Pair], data_cfg: Any, make: Sequence[str] = ("test", "valid")) -> SplitResult:
    """Split ``pairs`` by group into train plus the splits named in ``make``.

    ``make`` lists the held-out splits to carve out ("test", "valid"); the rest is train.
    """
    groups = _by_group(pairs)
    order = group_order(groups, data_cfg.split_seed)
    splits: dict[str, list[str]] = {}
    if "test" in make:
        cap = int(MAX_TEST_SHARE * len(pairs))
        base = int(TEST_BASE_SHARE * data_cfg.test_per_bucket * len(BUCKETS))
        splits["test"] = _choose_stratified(groups, order, data_cfg.test_per_bucket, cap, base)
    taken = {g for chosen in splits.values() for g in chosen}
    if "valid" in make:
        # dev: about valid_size pairs of random groups, then, with valid_per_bucket, groups
        # that fill the length buckets still short (dev BLEU by bucket needs long segments,
        # which random chapters hold few of)
        cap = int(MAX_VALID_SHARE * len(pairs))
        rest = [g for g in order if g not in taken]
        base = min(data_cfg.valid_size, cap)
        splits["valid"] = _choose_stratified(groups, rest, data_cfg.valid_per_bucket, cap, base,
                                              base_capped=True)
        taken |= set(splits["valid"])
    splits["train"] = [g for g in order if g not in taken]
    result = SplitResult(
        splits={name: sorted((p for g in chosen for p in groups[g]), key=lambda p: p.pos)
                for name, chosen in splits.items()}
    )
    if "test" in result.splits:
        counts = bucket_counts(result.splits["test"])
        result.shortfall = {
            b: data_cfg.test_per_bucket - n for b, n in counts.items() if n < data_cfg.test_per_bucket
        }
    return result


def join_long(pairs: Sequence[Pair], min_words: int, max_words: int) -> list[Pair]:
    """Consecutive pairs of one group joined into segments of min..max source words.

    A window slides over each group's pairs in text order; a gap (a verse dropped or
    unpaired) restarts it, so a segment is always continuous text. Segments do not
    overlap.
    """
    out: list[Pair] = []
    for group_pairs in _by_group(sorted(pairs, key=lambda p: p.pos)).values():
        window: list[Pair] = []
        for pair in group_pairs:
            if window and pair.pos != window[-1].pos + 1:
                window = []
            window.append(pair)
            while window and sum(p.src_words for p in window) > max_words:
                window.pop(0)
            if window and sum(p.src_words for p in window) >= min_words:
                out.append(_joined(window))
                window = []
    return out


def _joined(window: Sequence[Pair]) -> Pair:
    first, last = ref_bounds(window[0].ref)[0], ref_bounds(window[-1].ref)[1]
    return Pair(
        src=" ".join(p.src for p in window),
        tgt=" ".join(p.tgt for p in window),
        ref=first if first == last else f"{first}-{last}",
        group=window[0].group,
        pos=window[0].pos,
    )
