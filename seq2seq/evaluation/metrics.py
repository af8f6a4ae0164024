"""BLEU and chrF on detokenized strings: overall and by source-length bucket, with bootstrap CIs.

Pure scoring on plain lists of strings (docs/evaluation-protocol.md#scores-bleu-and-chrf-with-sacrebleu);
no model code. Everything reuses
sacrebleu's own machinery: each sentence's sufficient statistics are extracted once with
``Metric._extract_corpus_statistics`` (a ``(n_sentences, n_stats)`` array), a bootstrap
resample is a sum of those rows, and every score comes from
``Metric._compute_score_from_stats``, exactly as ``sacrebleu.significance`` does. Those two
methods are private in sacrebleu 2.6 but are what its own paired tests are built on.

Conventions (shared by the CIs, the paired test and the ratio-trend test):
- buckets by source length in whitespace words, width 10, last bucket ``51+``;
  an empty source (0 words) is refused with a :class:`DataError`: it is a corpus defect;
- resample indices come from ``numpy.random.default_rng(seed).choice`` like sacrebleu's;
  the overall scope uses ``default_rng(seed)`` (so it reproduces sacrebleu's paired test
  draw for draw) and bucket ``k`` uses ``default_rng([seed, k])``;
- a 95% interval is ``[sorted[n // 40], sorted[n - n // 40 - 1]]``, sacrebleu's indices.

The paired test and the ratio-trend test live in :mod:`seq2seq.evaluation.significance`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

from seq2seq.corpus.buckets import BUCKET_LABELS, bucket_indices, source_length
from seq2seq.errors import ConfigError, DataError

METRICS: tuple[str, ...] = ("BLEU", "chrF")

Stats = dict[str, np.ndarray]  # metric name -> (n_sentences, n_stats) sufficient statistics


# --------------------------------------------------------------------------- buckets
def _bucket_indices(sources: Sequence[str]) -> np.ndarray:
    """Bucket index (0..5) of every source, naming the first empty one. Shape ``(n,)``."""
    lengths = np.array([source_length(s) for s in sources], dtype=np.int64)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise DataError(
            f"source sentence {int(empty[0])} (0-based) is empty ({empty.size} empty in all); "
            "drop empty segments from the split before scoring"
        )
    return bucket_indices(lengths)


def _range_mask(spec: str, lengths: np.ndarray) -> np.ndarray:
    """Boolean mask of sources whose length matches ``"a-b"`` (inclusive) or ``"a+"``."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)|(\+))\s*", spec)
    if match is None:
        raise ConfigError(
            f"length range {spec!r} is not understood: write it as 'a-b' (e.g. '11-20') "
            "or 'a+' (e.g. '41+')"
        )
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else np.iinfo(np.int64).max
    return (lengths >= low) & (lengths <= high)


# ----------------------------------------------------------------- sufficient stats
def _check_inputs(sources: Sequence[str], **columns: Sequence[str]) -> None:
    """Refuse empty inputs, misaligned lists and non-strings with a message naming the fix."""
    if len(sources) == 0:
        raise DataError("nothing to score: the source list is empty; pass a non-empty split")
    for name, column in columns.items():
        if len(column) != len(sources):
            raise DataError(
                f"{name} has {len(column)} lines but there are {len(sources)} sources; "
                "score hypotheses and references of the same split, one line per source"
            )
        bad = next((i for i, x in enumerate(column) if not isinstance(x, str)), None)
        if bad is not None:
            raise DataError(f"{name} line {bad} is {type(column[bad]).__name__}, not a string")


def _metrics(trg_lang: str = "") -> dict[str, Metric]:
    """Fresh sacrebleu metrics with their defaults (BLEU: 13a tokens, exp smoothing; chrF2)."""
    return {"BLEU": BLEU(trg_lang=trg_lang), "chrF": CHRF()}


def segment_stats(
    hypotheses: Sequence[str], references: Sequence[str], metrics: Mapping[str, Metric]
) -> Stats:
    """Per-sentence sufficient statistics, metric name -> ``(n_sentences, n_stats)`` float64."""
    return {
        name: np.asarray(metric._extract_corpus_statistics(hypotheses, [references]), np.float64)
        for name, metric in metrics.items()
    }


def _score(metric: Metric, summed: np.ndarray) -> float:
    """Corpus score from summed statistics ``(n_stats,)`` through sacrebleu's own formula."""
    return float(metric._compute_score_from_stats(summed.tolist()).score)


def _resample_indices(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap indices ``(n_boot, n)``, drawn with the very call sacrebleu uses."""
    return rng.choice(n, size=(n_boot, n), replace=True)


def _resampled_scores(metric: Metric, stats: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Score of every resample. stats ``(n, n_stats)``, idx ``(n_boot, n)`` -> ``(n_boot,)``.

    A resample's statistics are ``counts @ stats`` where ``counts`` says how often each
    sentence was drawn: one BLAS call instead of materialising ``(n_boot, n, n_stats)``.
    """
    n_boot, n = idx.shape
    flat = (idx + n * np.arange(n_boot)[:, None]).ravel()
    counts = np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)
    sums = counts @ stats  # (n_boot, n_stats)
    return np.array([_score(metric, row) for row in sums])


def _interval(samples: np.ndarray) -> tuple[float, float]:
    """95% percentile interval with sacrebleu's ``estimate_ci`` indices (n // 40 each side)."""
    ordered = np.sort(samples)
    cut = len(ordered) // 40
    return float(ordered[cut]), float(ordered[len(ordered) - cut - 1])


def _scope_rng(seed: int, scope: int | None) -> np.random.Generator:
    """RNG of one scope: ``None`` is the whole set (sacrebleu's stream), else a bucket index."""
    return np.random.default_rng(seed if scope is None else [seed, scope])


def _signatures(metrics: Mapping[str, Metric], n_boot: int, seed: int) -> dict[str, str]:
    """sacrebleu signature strings, with the bootstrap size and seed as sacrebleu adds them."""
    out = {}
    for name, metric in metrics.items():
        sig = metric.get_signature()
        sig.update("bs", n_boot)
        sig.update("seed", seed)
        out[name] = sig.format()
    return out


# ------------------------------------------------------------------ bucket scores
def _scope_scores(
    metrics: Mapping[str, Metric],
    stats: Stats,
    rows: np.ndarray,
    rng: np.random.Generator,
    n_boot: int,
    entropies: np.ndarray | None,
) -> dict[str, Any]:
    """Scores, 95% intervals and diagnostics over the sentences ``rows`` (indices, ``(m,)``)."""
    if rows.size == 0:
        return {"count": 0, "BLEU": None, "chrF": None, "length_ratio": None,
                "attention_entropy": None}
    idx = _resample_indices(rows.size, n_boot, rng)
    out: dict[str, Any] = {"count": int(rows.size)}
    for name, metric in metrics.items():
        sub = stats[name][rows]
        lo, hi = _interval(_resampled_scores(metric, sub, idx))
        out[name] = {"score": _score(metric, sub.sum(axis=0)), "lo": lo, "hi": hi}
    # BLEU's first two statistics are the hypothesis and closest-reference token counts.
    sys_len, ref_len = stats["BLEU"][rows, :2].sum(axis=0)
    out["length_ratio"] = float(sys_len / ref_len) if ref_len else None
    out["attention_entropy"] = None if entropies is None else float(entropies[rows].mean())
    return out


def score_buckets(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    n_boot: int = 1000,
    seed: int = 12345,
    entropies: Sequence[float] | None = None,
    trg_lang: str = "",
) -> dict[str, Any]:
    """Corpus BLEU and chrF overall and per source-length bucket, with 95% bootstrap CIs.

    Args:
        sources, hypotheses, references: one detokenized string per sentence, aligned.
        n_boot: bootstrap resamples per scope (resampling sentences within the scope).
        seed: RNG seed; the same seed gives the same intervals.
        entropies: optional mean attention entropy per sentence, ``(n,)``.
        trg_lang: target language code, only to let sacrebleu pick its tokenizer.

    Returns:
        ``{"n_boot", "seed", "signatures": {metric: str}, "overall": scope,
        "buckets": {label: scope}}`` where a scope is ``{"count", "BLEU": {"score", "lo",
        "hi"}, "chrF": {...}, "length_ratio", "attention_entropy"}``; an empty bucket has
        count 0 and ``None`` everywhere else.
    """
    _check_inputs(sources, hypotheses=hypotheses, references=references)
    if n_boot < 1:
        raise ConfigError(f"n_boot must be at least 1, got {n_boot}; 1000 is the default")
    ent = None
    if entropies is not None:
        if len(entropies) != len(sources):
            raise DataError(
                f"got {len(entropies)} attention entropies for {len(sources)} sentences; "
                "pass one entropy per sentence or none"
            )
        ent = np.asarray(entropies, dtype=np.float64)
    buckets = _bucket_indices(sources)
    metrics = _metrics(trg_lang)
    stats = segment_stats(hypotheses, references, metrics)
    every = np.arange(len(sources))
    return {
        "n_boot": n_boot,
        "seed": seed,
        "signatures": _signatures(metrics, n_boot, seed),
        "overall": _scope_scores(metrics, stats, every, _scope_rng(seed, None), n_boot, ent),
        "buckets": {
            label: _scope_scores(
                metrics, stats, np.flatnonzero(buckets == k), _scope_rng(seed, k), n_boot, ent
            )
            for k, label in enumerate(BUCKET_LABELS)
        },
    }


LONG_GROUP = "41+"  # the long side of criterion 2, also logged at every validation


def quick_bucket_scores(
    src_words: Sequence[int], hypotheses: Sequence[str], references: Sequence[str],
    trg_lang: str = "",
) -> list[dict[str, Any]]:
    """Corpus BLEU, chrF and output/reference length ratio per bucket, without intervals.

    What training logs at every validation: one row per bucket in order, then the long
    group of criterion 2 (``41+``) and ``all``. ``src_words`` gives each sentence's source
    length in words, ``(n,)``. A row is ``{"bucket", "count", "bleu", "chrf",
    "length_ratio"}``; an empty bucket has count 0 and NaN scores.
    """
    _check_inputs(list(src_words), hypotheses=hypotheses, references=references)
    lengths = np.asarray(src_words, dtype=np.int64)
    if (lengths < 1).any():
        raise DataError("a dev source has 0 words; drop empty segments before scoring")
    buckets = bucket_indices(lengths)
    metrics = _metrics(trg_lang)
    stats = segment_stats(hypotheses, references, metrics)
    scopes = [(label, buckets == k) for k, label in enumerate(BUCKET_LABELS)]
    scopes += [(LONG_GROUP, _range_mask(LONG_GROUP, lengths)), ("all", np.ones_like(lengths, bool))]
    rows = []
    for label, mask in scopes:
        sel = np.flatnonzero(mask)
        row: dict[str, Any] = {"bucket": label, "count": int(sel.size)}
        for key, name in (("bleu", "BLEU"), ("chrf", "chrF")):
            row[key] = _score(metrics[name], stats[name][sel].sum(axis=0)) if sel.size else float("nan")
        sys_len, ref_len = stats["BLEU"][sel, :2].sum(axis=0) if sel.size else (0.0, 0.0)
        row["length_ratio"] = float(sys_len / ref_len) if ref_len else float("nan")
        rows.append(row)
    return rows


def sentence_scores(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    trg_lang: str = "",
) -> list[dict[str, Any]]:
    """Per-sentence BLEU (effective order, as sacrebleu advises for sentences) and chrF.

    Returns one dict per sentence: ``index, src_words, bucket, bleu, chrf, hyp_len,
    ref_len`` (lengths in sacrebleu's 13a tokens).
    """
    _check_inputs(sources, hypotheses=hypotheses, references=references)
    buckets = _bucket_indices(sources)
    metrics = _metrics(trg_lang)
    stats = segment_stats(hypotheses, references, metrics)
    # Effective order changes only the formula, not the statistics, so they are reused.
    sentence_bleu = BLEU(trg_lang=trg_lang, effective_order=True)
    return [
        {
            "index": i,
            "src_words": source_length(sources[i]),
            "bucket": BUCKET_LABELS[buckets[i]],
            "bleu": _score(sentence_bleu, stats["BLEU"][i]),
            "chrf": _score(metrics["chrF"], stats["chrF"][i]),
            "hyp_len": int(stats["BLEU"][i, 0]),
            "ref_len": int(stats["BLEU"][i, 1]),
        }
        for i in range(len(sources))
    ]
