"""`seq2seq-evaluate`: decode a split with trained runs, score it by length bucket, compare.

One run::

    seq2seq-evaluate run=runs/short_bahdanau split=test beam=5

writes into ``<run>/eval/<split>-beam<k>/`` (or ``out_dir=``): ``hypotheses.txt``,
``sentences.csv`` (per-sentence BLEU/chrF, attention entropy, output length),
``results.json`` / ``results.csv`` (overall and per-bucket BLEU and chrF with 95%
bootstrap intervals, sacrebleu signatures, length ratio and attention entropy per
bucket) and ``table.md``, which is also printed.

Several runs (``runs=[a,b,c]``) are each evaluated as above, then compared in
``out_dir`` (default ``runs/compare/<split>-beam<k>-<names>``): a paired bootstrap test per
bucket against ``baseline`` (default: the first run) and the BLEU-ratio trend test for
every other system (docs/evaluation-protocol.md#criterion-2-the-bottleneck-grows-with-length).
``apertium=true`` adds the Apertium baseline.

Decodings are cached in ``<run>/eval/cache/``, keyed by the checkpoint's content,
the split's fingerprint and the search settings, so scoring again (or an interrupted
``seq2seq-reproduce``) does not decode again. Scoring itself is :mod:`seq2seq.evaluation.metrics`
and :mod:`seq2seq.evaluation.significance`; tables and files are :mod:`seq2seq.evaluation.tables`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from seq2seq import atomic
from seq2seq.corpus.batching import cache_key
from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluation import apertium
from seq2seq.evaluation import tables as report
from seq2seq.evaluation.metrics import score_buckets, sentence_scores
from seq2seq.evaluation.significance import paired_test, ratio_trend_test
from seq2seq.inference.decode import Decoded, decode
from seq2seq.inference.ensemble import load_models, run_list
from seq2seq.runs.checkpoint import (
    BEST,
    config_from_checkpoint,
    corpus_build_key,
    find_checkpoint,
    load_checkpoint,
)

log = logging.getLogger(__name__)
EVAL_DIR, CACHE_DIR = "eval", "cache"


@dataclass
class Split:
    """One split of a corpus, as plain aligned lists of detokenized strings."""

    name: str
    sources: list[str]
    references: list[str]
    fingerprint: str  # the datasets fingerprint: changes whenever the split's content does
    tgt_lang: str


@dataclass
class SystemOutput:
    """One system's translation of a split (a run decoded, or Apertium)."""

    name: str
    hypotheses: list[str]
    entropies: list[float] | None  # None: the system has no attention distribution
    lengths: list[int] | None  # output length in target subwords; None for Apertium
    seconds: float  # time it took to produce, even when it came from the cache
    cached: bool
    source: str  # what produced it: a checkpoint path or the apertium version


# ------------------------------------------------------------------ data
def load_split(data_cfg: Any, name: str) -> Split:
    """Split ``name`` of the corpus ``data_cfg`` describes; DataError for an unknown split."""
    from seq2seq.corpus import load_corpus

    corpus = load_corpus(data_cfg)
    if name not in corpus:
        raise DataError(f"split {name!r} is not in corpus {data_cfg.name!r}: "
                        f"choose one of {sorted(corpus)} (split=<name>)")
    ds = corpus[name]
    if len(ds) == 0:
        raise DataError(f"split {name!r} of corpus {data_cfg.name!r} is empty: give it pairs "
                        "(data.test_per_bucket for test, data.test_long_min_words/max_words for "
                        "test_long, or data.test_file for data=local) and rebuild it with "
                        "seq2seq-data")
    pairs = ds["translation"]
    return Split(name, [p[data_cfg.src_lang] for p in pairs],
                 [p[data_cfg.tgt_lang] for p in pairs], ds._fingerprint, data_cfg.tgt_lang)


def file_digest(path: Path) -> str:
    """sha256 of a file's content (hex, first 16 digits): the cache key of a checkpoint."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()[:16]


def _write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    atomic.write_json(path, payload, ensure_ascii=False)


# --------------------------------------------------------------- decoding
def run_split(run: Any, split_name: str) -> tuple[Path, DictConfig, Split]:
    """The checkpoint of ``run`` (best.pt, else last.pt), its config and its corpus's split;
    for an ensemble (a list of runs) the first member's."""
    ckpt_path = find_checkpoint(run_list(run)[0])
    ckpt = load_checkpoint(ckpt_path)
    cfg = config_from_checkpoint(ckpt)
    split = load_split(cfg.data, split_name)
    _warn_if_rebuilt(ckpt, cfg, ckpt_path)
    return ckpt_path, cfg, split


def _warn_if_rebuilt(ckpt: dict[str, Any], cfg: DictConfig, path: Path) -> None:
    """Name a corpus rebuilt since the run trained (its split may hold other sentences)."""
    saved = (ckpt.get("identity") or {}).get("corpus")
    now = corpus_build_key(cfg.data)
    if saved and now and saved != now:
        log.warning("%s was trained on corpus build %s, but corpus %r is now build %s: the "
                    "scores are on the rebuilt corpus, whose splits may differ", path, saved,
                    cfg.data.name, now)


def _identity(run: Any) -> tuple[list[Path], str]:
    """The checkpoint files of ``run`` (one, or an ensemble's) and their joint content key."""
    paths = [find_checkpoint(r) for r in run_list(run)]
    return paths, "+".join(file_digest(p) for p in paths)


def eval_dir(run: Any, split_name: str, beam: int) -> Path:
    """Where one system's evaluation files go: ``<run>/eval/<split>-beam<k>`` (best.pt), with
    ``-<stem>`` for another checkpoint of the run (``-last``, ``-averaged``); an ensemble's
    in its first member's eval folder, ``<split>-beam<k>-ensemble-<key>``."""
    paths = [find_checkpoint(r) for r in run_list(run)]
    folder = f"{split_name}-beam{beam}"
    if len(paths) > 1:  # only an ensemble's folder needs the (hashed) content key
        folder += f"-ensemble-{cache_key(_identity(run)[1])[:8]}"
    elif not Path(run_list(run)[0]).is_dir() and paths[0].name != BEST:
        # last.pt or averaged.pt named explicitly: its own folder, next to best.pt's
        folder += f"-{paths[0].stem}"
    return paths[0].parent / EVAL_DIR / folder


def default_name(run: Any) -> str:
    """A run's display name: its folder; an ensemble's: its members' folders joined by +."""
    return "+".join(find_checkpoint(r).parent.resolve().name for r in run_list(run))


def decode_run(run: Any, split_name: str, ev: Any, name: str | None = None
               ) -> tuple[Split, SystemOutput]:
    """Decode split ``split_name`` with the run's checkpoint (a list of runs: their
    ensemble), reusing a cached decoding.

    ``ev`` holds the EvalConfig fields (beam, alpha, max_len_ratio, max_len_extra,
    batch_tokens, device, threads, workers). The cache lives in ``<run folder>/eval/cache/``.
    """
    from seq2seq.inference.workers import choose_workers
    from seq2seq.runtime import resolve_device

    _, _, split = run_split(run, split_name)
    paths, identity = _identity(run)
    key = cache_key(identity, split.fingerprint, ev.beam, ev.alpha,
                    ev.max_len_ratio, ev.max_len_extra)
    cache = paths[0].parent / EVAL_DIR / CACHE_DIR / f"{split_name}-{key}.json"
    name = name or default_name(run)
    source = ",".join(str(p) for p in paths)
    payload = atomic.read_json(cache)
    if payload is not None and len(payload["hypotheses"]) == len(split.sources):
        log.info("%s on %s: reusing the decoding in %s", name, split_name, cache)
        return split, _system(name, Decoded.from_dict(payload), True, source)
    device = resolve_device(ev.device)
    model, tokenizers, _ = load_models([str(p) for p in paths], device=device)
    workers, why = choose_workers(ev.workers, model, ev.batch_tokens, ev.beam)
    log.info("%s on %s: decoding %d sentences (beam %d) on %s; workers %s", name, split_name,
             len(split.sources), ev.beam, device, why)
    decoded = decode(model, tokenizers, split.sources, beam=ev.beam, alpha=ev.alpha,
                     max_len_ratio=ev.max_len_ratio, max_len_extra=ev.max_len_extra,
                     batch_tokens=ev.batch_tokens, device=device, workers=workers)
    _write_json_atomic(cache, decoded.to_dict())
    log.info("%s on %s: %.1f s, %.1f sentences/s", name, split_name, decoded.seconds,
             len(split.sources) / max(decoded.seconds, 1e-9))
    return split, _system(name, decoded, False, source)


def _system(name: str, decoded: Decoded, cached: bool, source: str) -> SystemOutput:
    ents = decoded.entropies
    no_attention = all(math.isnan(e) for e in ents)
    return SystemOutput(name, decoded.hypotheses, None if no_attention else ents,
                        decoded.lengths, decoded.seconds, cached, source)


def apertium_output(split: Split, cache_dir: Path, pair: str = "spa-eng") -> SystemOutput | None:
    """Apertium's translation of ``split`` (cached in ``cache_dir``), or None if missing."""
    version = apertium.version()
    if version is None:
        apertium.translate([], pair=pair)  # logs how to install it
        return None
    cache = cache_dir / f"apertium-{split.name}-{cache_key(split.fingerprint, version, pair)}.json"
    payload = atomic.read_json(cache)
    if payload is not None and len(payload["hypotheses"]) == len(split.sources):
        return SystemOutput("apertium", payload["hypotheses"], None, None,
                            payload["seconds"], True, version)
    start = time.perf_counter()
    hyps = apertium.translate(split.sources, pair=pair)
    if hyps is None:
        return None
    seconds = time.perf_counter() - start
    _write_json_atomic(cache, {"hypotheses": hyps, "seconds": seconds})
    log.info("apertium on %s: %.1f s", split.name, seconds)
    return SystemOutput("apertium", hyps, None, None, seconds, False, version)


# ---------------------------------------------------------------- scoring
def score_system(split: Split, system: SystemOutput, ev: Any) -> dict[str, Any]:
    """:func:`~seq2seq.evaluation.metrics.score_buckets` of one system on ``split``."""
    return score_buckets(split.sources, system.hypotheses, split.references, n_boot=ev.n_boot,
                         seed=ev.boot_seed, entropies=system.entropies, trg_lang=split.tgt_lang)


def compare(split: Split, systems: Mapping[str, SystemOutput], baseline: str, ev: Any
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Paired bootstrap of every system against ``baseline``, and the ratio-trend test
    (docs/evaluation-protocol.md#criterion-2-the-bottleneck-grows-with-length) of every other
    model run against it; a trend that cannot be computed (no 11-20 or 41+ sources in the
    split) is ``{"error": why}``."""
    hyps = {name: s.hypotheses for name, s in systems.items()}
    comparison = paired_test(split.sources, split.references, hyps, baseline, n_boot=ev.n_boot,
                             seed=ev.boot_seed, trg_lang=split.tgt_lang)
    trends: dict[str, Any] = {}
    for name in systems:
        # the trend test compares two neural arms (attention vs none); Apertium has
        # no bottleneck to probe, so it only gets the paired test
        if name == baseline or "apertium" in (name, baseline):
            continue
        try:
            trends[name] = ratio_trend_test(split.sources, split.references, hyps[name],
                                            hyps[baseline], n_boot=ev.n_boot, seed=ev.boot_seed,
                                            trg_lang=split.tgt_lang)
        except DataError as err:
            trends[name] = {"error": str(err)}
    return comparison, trends


def write_system(out_dir: Path, split: Split, system: SystemOutput, scores: Mapping[str, Any]
                 ) -> str:
    """The files of one evaluated system (see the module docstring); returns table.md's text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out_dir / "hypotheses.txt",
                      "".join(" ".join(h.splitlines()) + "\n" for h in system.hypotheses))
    rows = sentence_scores(split.sources, system.hypotheses, split.references,
                           trg_lang=split.tgt_lang)
    for i, row in enumerate(rows):
        ent = None if system.entropies is None else system.entropies[i]
        row["attention_entropy"] = None if ent is None or math.isnan(ent) else round(ent, 4)
        row["out_tokens"] = None if system.lengths is None else system.lengths[i]
    report.write_sentence_scores(out_dir / "sentences.csv", rows)
    report.write_results(out_dir, {system.name: scores})
    table = _tables({system.name: scores}, None, {}, f"{system.name} on {split.name}")
    atomic.write_text(out_dir / "table.md", table + "\n")
    return table


def _tables(scores: Mapping[str, Any], comparison: Mapping[str, Any] | None,
            trends: Mapping[str, Any], title: str) -> str:
    parts = [f"## {title}", "", report.markdown_table(scores, comparison), "",
             "Length ratio (output/reference, 13a tokens) and mean attention entropy (nats):",
             "", report.diagnostics_table(scores)]
    for name, trend in trends.items():
        line = trend["error"] if "error" in trend else report.trend_summary(trend)
        parts += ["", f"- {name} vs {comparison['baseline'] if comparison else '?'}: {line}"]
    return "\n".join(parts)


# ------------------------------------------------------------- the app
def _names(cfg: DictConfig, runs: Sequence[str]) -> list[str]:
    names = list(cfg.names) or [default_name(r) for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError(f"runs have the same names {names}: give each a name with "
                          "names=[a,b,...]")
    if "apertium" in names and cfg.apertium:
        raise ConfigError("a run is named 'apertium', like the Apertium system: rename it "
                          "with names=[...]")
    return names


def _evaluate_runs(cfg: DictConfig, runs: Sequence[str], names: Sequence[str], alone: bool
                   ) -> tuple[Split, dict[str, SystemOutput], dict[str, Any]]:
    """Decode and score every run, writing each one's files; returns the shared split."""
    systems: dict[str, SystemOutput] = {}
    scores: dict[str, Any] = {}
    split: Split | None = None
    for run, name in zip(runs, names, strict=True):
        this_split, system = decode_run(run, cfg.split, cfg, name)
        if split is not None and this_split.fingerprint != split.fingerprint:
            raise DataError(f"run {run} was trained on another corpus than {runs[0]}: "
                            "compare runs that share their data")
        split = this_split
        out = (Path(cfg.out_dir) if cfg.out_dir and alone
               else eval_dir(run, cfg.split, cfg.beam))
        systems[name], scores[name] = system, score_system(split, system, cfg)
        table = write_system(out, split, system, scores[name])
        if alone:
            print(table)
            print(f"\nwritten to {out}")
    assert split is not None
    return split, systems, scores


def evaluate_main(cfg: DictConfig) -> Path:
    """`seq2seq-evaluate`: evaluate one run (``run=``) or compare several (``runs=[..]``).

    Returns the folder the results (of the comparison, with several systems) were written to.
    """
    runs = [cfg.run] if cfg.run is not None else list(cfg.runs)
    names = _names(cfg, runs)
    alone = len(runs) == 1 and not cfg.apertium
    split, systems, scores = _evaluate_runs(cfg, runs, names, alone)
    if alone:
        return Path(cfg.out_dir) if cfg.out_dir else eval_dir(runs[0], cfg.split, cfg.beam)
    if cfg.apertium:
        cache = eval_dir(runs[0], cfg.split, cfg.beam).parent / CACHE_DIR
        ap = apertium_output(split, cache, cfg.apertium_pair)
        if ap is not None:
            systems["apertium"], scores["apertium"] = ap, score_system(split, ap, cfg)
    baseline = cfg.baseline or names[0]
    if baseline not in systems:
        raise ConfigError(f"baseline={baseline!r} is not one of the systems {list(systems)}: "
                          "name one of them")
    out = (Path(cfg.out_dir) if cfg.out_dir
           else Path("runs") / "compare" / f"{cfg.split}-beam{cfg.beam}-{'-'.join(systems)}")
    comparison, trends = (compare(split, systems, baseline, cfg) if len(systems) > 1
                          else (None, {}))
    report.write_results(out, scores, comparison, trends or None)
    table = _tables(scores, comparison, trends, f"{' vs '.join(systems)} on {split.name}")
    atomic.write_text(out / "table.md", table + "\n")
    print(table)
    print(f"\nwritten to {out}")
    return out
