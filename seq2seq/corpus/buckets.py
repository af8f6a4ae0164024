"""Source-length buckets: the one definition that the test split, scoring, validation and
the report share (docs/evaluation-protocol.md#length-buckets).

A source's length is its number of whitespace-separated words. Buckets are 10 words
wide up to 50; the last one, 51+, has no upper bound.
"""

from __future__ import annotations

import numpy as np

from seq2seq.errors import DataError

BUCKET_WIDTH = 10
LAST_BUCKET_START = 51
# (low, high) in words, both inclusive; None = no upper bound
BUCKETS: tuple[tuple[int, int | None], ...] = (
    *((low, low + BUCKET_WIDTH - 1) for low in range(1, LAST_BUCKET_START, BUCKET_WIDTH)),
    (LAST_BUCKET_START, None),
)
BUCKET_LABELS: tuple[str, ...] = tuple(f"{lo}-{hi}" if hi is not None else f"{lo}+"
                                       for lo, hi in BUCKETS)


def source_length(sentence: str) -> int:
    """Length of a source sentence in whitespace-separated words."""
    return len(sentence.split())


def bucket_label(n_words: int) -> str:
    """Bucket of a source length: 1..10 -> "1-10", ..., 41..50 -> "41-50", 51+ -> "51+"."""
    if n_words < 1:
        raise DataError(
            f"a source sentence has {n_words} words; empty sources cannot be bucketed: "
            "drop empty segments from the split before scoring"
        )
    return BUCKET_LABELS[int(bucket_indices(np.array([n_words]))[0])]


def bucket_of(sentence: str) -> str:
    """Bucket label of one source sentence (see :func:`bucket_label`)."""
    return bucket_label(source_length(sentence))


def bucket_indices(lengths: np.ndarray) -> np.ndarray:
    """Bucket index (0..5) of every source length (words, all >= 1); shape ``(n,)``."""
    return np.minimum((lengths - 1) // BUCKET_WIDTH, len(BUCKET_LABELS) - 1)
