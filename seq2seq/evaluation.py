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
bucket against ``baseline`` (default: the first run) and the BLEU-ratio trend test of
GUIDE §4 for every other system. ``apertium=true`` adds the Apertium baseline.

Decodings are cached in ``<run>/eval/cache/``, keyed by the checkpoint's content,
the split's fingerprint and the search settings, so scoring again (or an interrupted
``seq2seq-reproduce``) does not decode again. Scoring itself is :mod:`seq2seq.evaluate`;
tables and files are :mod:`seq2seq.report`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from seq2seq import apertium, report
from seq2seq.batching import cache_key
from seq2seq.checkpoint import config_from_checkpoint, find_checkpoint, load_checkpoint
from seq2seq.decode import Decoded, decode
from seq2seq.errors import ConfigError, DataError
from seq2seq.evaluate import paired_test, ratio_trend_test, score_buckets, sentence_scores

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
    pairs = ds["translation"]
    return Split(name, [p[data_cfg.src_lang] for p in pairs],
                 [p[data_cfg.tgt_lang] for p in pairs], ds._fingerprint, data_cfg.tgt_lang)


def file_digest(path: Path) -> str:
    """sha256 of a file's content (hex, first 16 digits): the cache key of a checkpoint."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()[:16]


def _write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, ensure_ascii=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_json(path: Path) -> dict[str, Any] | None:
    """A cached JSON payload, or None when it is missing or unreadable (then it is redone)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------- decoding
def run_split(run: str | Path, split_name: str) -> tuple[Path, DictConfig, Split]:
    """The checkpoint of ``run`` (best.pt, else last.pt), its config and its corpus's split."""
    ckpt_path = find_checkpoint(run)
    cfg = config_from_checkpoint(load_checkpoint(ckpt_path))
    return ckpt_path, cfg, load_split(cfg.data, split_name)


def decode_run(run: str | Path, split_name: str, ev: Any, name: str | None = None
               ) -> tuple[Split, SystemOutput]:
    """Decode split ``split_name`` with the run's checkpoint, reusing a cached decoding.

    ``ev`` holds the EvalConfig fields (beam, alpha, max_len_ratio, max_len_extra,
    batch_tokens, device, threads). The cache lives in ``<run folder>/eval/cache/``.
    """
    from seq2seq.checkpoint import load_model
    from seq2seq.runtime import resolve_device, set_threads

    ckpt_path, _, split = run_split(run, split_name)
    key = cache_key(file_digest(ckpt_path), split.fingerprint, ev.beam, ev.alpha,
                    ev.max_len_ratio, ev.max_len_extra)
    cache = ckpt_path.parent / EVAL_DIR / CACHE_DIR / f"{split_name}-{key}.json"
    name = name or ckpt_path.parent.name
    payload = _read_json(cache)
    if payload is not None and len(payload["hypotheses"]) == len(split.sources):
        log.info("%s on %s: reusing the decoding in %s", name, split_name, cache)
        return split, _system(name, Decoded.from_dict(payload), True, str(ckpt_path))
    device = resolve_device(ev.device)
    set_threads(ev.threads)
    model, tokenizers, _ = load_model(ckpt_path, device=device)
    log.info("%s on %s: decoding %d sentences (beam %d) on %s", name, split_name,
             len(split.sources), ev.beam, device)
    decoded = decode(model, tokenizers, split.sources, beam=ev.beam, alpha=ev.alpha,
                     max_len_ratio=ev.max_len_ratio, max_len_extra=ev.max_len_extra,
                     batch_tokens=ev.batch_tokens, device=device)
    _write_json_atomic(cache, decoded.to_dict())
    log.info("%s on %s: %.1f s, %.1f sentences/s", name, split_name, decoded.seconds,
             len(split.sources) / max(decoded.seconds, 1e-9))
    return split, _system(name, decoded, False, str(ckpt_path))


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
    payload = _read_json(cache)
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
    """:func:`~seq2seq.evaluate.score_buckets` of one system on ``split``."""
    return score_buckets(split.sources, system.hypotheses, split.references, n_boot=ev.n_boot,
                         seed=ev.boot_seed, entropies=system.entropies, trg_lang=split.tgt_lang)


def compare(split: Split, systems: Mapping[str, SystemOutput], baseline: str, ev: Any
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Paired bootstrap of every system against ``baseline``, and the ratio-trend test
    (GUIDE §4 criterion 2) of every other model run against it; a trend that cannot be
    computed (no 11-20 or 41+ sources in the split) is ``{"error": why}``."""
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
    (out_dir / "hypotheses.txt").write_text(
        "".join(" ".join(h.splitlines()) + "\n" for h in system.hypotheses), encoding="utf-8")
    rows = sentence_scores(split.sources, system.hypotheses, split.references,
                           trg_lang=split.tgt_lang)
    for i, row in enumerate(rows):
        ent = None if system.entropies is None else system.entropies[i]
        row["attention_entropy"] = None if ent is None or math.isnan(ent) else round(ent, 4)
        row["out_tokens"] = None if system.lengths is None else system.lengths[i]
    report.write_sentence_scores(out_dir / "sentences.csv", rows)
    report.write_results(out_dir, {system.name: scores})
    table = _tables({system.name: scores}, None, {}, f"{system.name} on {split.name}")
    (out_dir / "table.md").write_text(table + "\n", encoding="utf-8")
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
    names = list(cfg.names) or [Path(r).resolve().name for r in runs]
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
               else Path(system.source).parent / EVAL_DIR / f"{cfg.split}-beam{cfg.beam}")
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
        return Path(cfg.out_dir) if cfg.out_dir else (
            Path(systems[names[0]].source).parent / EVAL_DIR / f"{cfg.split}-beam{cfg.beam}")
    if cfg.apertium:
        cache = Path(systems[names[0]].source).parent / EVAL_DIR / CACHE_DIR
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
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"\nwritten to {out}")
    return out
