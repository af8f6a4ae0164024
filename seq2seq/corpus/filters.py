"""Drop pairs that cannot be good training or test data; count every drop by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from seq2seq.corpus.pair import Pair


def drop_reason(pair: Pair, data_cfg: Any) -> str | None:
    """Why ``pair`` is dropped, or None to keep it. Lengths are whitespace words."""
    s, t = pair.src_words, pair.tgt_words
    if s == 0 or t == 0:
        return "empty_side"
    if min(s, t) < data_cfg.min_words:
        return "too_short"
    if max(s, t) > data_cfg.max_words:
        return "too_long"
    # A misaligned pair shows as one side far longer than the other.
    if max(s, t) / min(s, t) > data_cfg.max_len_ratio:
        return "length_ratio"
    return None


def filter_pairs(pairs: Iterable[Pair], data_cfg: Any) -> tuple[list[Pair], Counter[str]]:
    """Pairs that pass :func:`drop_reason`, and how many were dropped for each reason."""
    kept: list[Pair] = []
    dropped: Counter[str] = Counter()
    for pair in pairs:
        reason = drop_reason(pair, data_cfg)
        if reason is None:
            kept.append(pair)
        else:
            dropped[reason] += 1
    return kept, dropped
