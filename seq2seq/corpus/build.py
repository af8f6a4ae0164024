"""Build a corpus folder (``seq2seq-data``): read, filter, split, save, manifest.

Every corpus kind produces :class:`~seq2seq.corpus.pair.Pair` lists; filtering,
splitting, ``test_long`` and saving are shared. A build is skipped when the folder
holds one with the same build key (data settings + source versions).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seq2seq.corpus import bible, hub, local
from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.corpus.filters import filter_pairs
from seq2seq.corpus.pair import Pair
from seq2seq.corpus.splits import bucket_counts, join_long, split_pairs
from seq2seq.corpus.store import (
    SPLITS,
    corpus_dir,
    load_dataset_dict,
    read_manifest,
    save_corpus,
    to_dataset_dict,
)
from seq2seq.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BUILDER_VERSION = 1  # bump when a change to this package changes what a build produces
# Settings that do not change the content of a build.
_NOT_IN_KEY = ("name", "root", "sword_path")


def _read_sword(data_cfg: Any) -> tuple[dict[str, list[Pair]], dict[str, Any]]:
    pairs, info = bible.read_sword(data_cfg)
    return {"train": pairs}, info


def _read_local(data_cfg: Any) -> tuple[dict[str, list[Pair]], dict[str, Any]]:
    return local.read_local(data_cfg), {}


def _read_hub(data_cfg: Any) -> tuple[dict[str, list[Pair]], dict[str, Any]]:
    return hub.read_hub(data_cfg), {}


# kind -> (read the pairs by split, cheap fingerprint of the inputs)
KINDS: dict[str, tuple[Callable[[Any], tuple[dict[str, list[Pair]], dict[str, Any]]], Callable[[Any], Any]]] = {
    "sword": (_read_sword, bible.fingerprint),
    "local": (_read_local, local.fingerprint),
    "hub": (_read_hub, hub.fingerprint),
}


def check_kind(data_cfg: Any) -> None:
    if data_cfg.kind not in KINDS:
        raise ConfigError(
            f"data.kind={data_cfg.kind!r} is unknown: use one of {', '.join(KINDS)} "
            "(e.g. data=bible_es_en, data=local, data=hub)"
        )


def _settings(data_cfg: Any) -> dict[str, Any]:
    if isinstance(data_cfg, DictConfig):
        values = OmegaConf.to_container(data_cfg, resolve=True, enum_to_str=True)
    elif dataclasses.is_dataclass(data_cfg):
        values = dataclasses.asdict(data_cfg)
    else:
        values = dict(data_cfg)
    return {k: v for k, v in sorted(values.items()) if k not in _NOT_IN_KEY}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_key(data_cfg: Any) -> str:
    """Hash of the settings alone (checked when a corpus is loaded)."""
    return _digest({"builder": BUILDER_VERSION, "data": _settings(data_cfg)})


def build_key(data_cfg: Any, sources: Any) -> str:
    """Hash of the settings and the inputs' fingerprint (module versions, file hashes)."""
    return _digest({"config": config_key(data_cfg), "sources": sources})


def _make_splits(
    given: dict[str, list[Pair]], data_cfg: Any
) -> tuple[dict[str, list[Pair]], Counter[str]]:
    """Filter every split, carve the missing held-out splits from train, add test_long."""
    dropped: Counter[str] = Counter()
    kept: dict[str, list[Pair]] = {}
    for name, pairs in given.items():
        kept[name], counts = filter_pairs(pairs, data_cfg)
        dropped.update(counts)
    missing = [name for name in ("test", "valid") if name not in kept]
    if missing:
        result = split_pairs(kept["train"], data_cfg, make=missing)
        kept.update(result.splits)
    kept["test_long"] = join_long(kept["test"], data_cfg.test_long_min_words, data_cfg.test_long_max_words)
    return {name: kept[name] for name in SPLITS}, dropped


def _test_section(splits: dict[str, list[Pair]], data_cfg: Any) -> dict[str, Any]:
    buckets = bucket_counts(splits["test"])
    shortfall = {b: data_cfg.test_per_bucket - n for b, n in buckets.items() if n < data_cfg.test_per_bucket}
    long_words = [p.src_words for p in splits["test_long"]]
    section: dict[str, Any] = {
        "test_buckets": buckets,
        "test_per_bucket_minimum": data_cfg.test_per_bucket,
        "test_bucket_shortfall": shortfall,
        "test_long": {
            "segments": len(long_words),
            "src_words_min": min(long_words, default=0),
            "src_words_max": max(long_words, default=0),
        },
        "train_buckets": bucket_counts(splits["train"]),
    }
    if shortfall:
        section["note"] = (
            "too few natural segments for buckets " + ", ".join(shortfall)
            + f" within the test size cap; these buckets hold fewer than {data_cfg.test_per_bucket}"
        )
    return section


def build_corpus(data_cfg: Any, force: bool = False) -> Path:
    """Build ``data/<name>/`` unless an identical build is there; returns the folder."""
    check_kind(data_cfg)
    read, fingerprint = KINDS[data_cfg.kind]
    folder = corpus_dir(data_cfg)
    sources = fingerprint(data_cfg)
    key = build_key(data_cfg, sources)
    old = read_manifest(folder)
    if not force and old is not None and old.get("build_key") == key:
        log.info("corpus %s is up to date (build key %s)", folder, key)
        return folder
    start = time.monotonic()
    log.info("building corpus %s (kind=%s)", folder, data_cfg.kind)
    given, info = read(data_cfg)
    splits, dropped = _make_splits(given, data_cfg)
    dropped.update(info.pop("dropped", {}))
    manifest: dict[str, Any] = {
        "name": data_cfg.name,
        "kind": data_cfg.kind,
        "languages": [data_cfg.src_lang, data_cfg.tgt_lang],
        "build_key": key,
        "config_key": config_key(data_cfg),
        "builder_version": BUILDER_VERSION,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": sources,
        "counts": {name: len(pairs) for name, pairs in splits.items()},
        **_test_section(splits, data_cfg),
        "dropped": dict(sorted(dropped.items())),
        **info,
        "settings": _settings(data_cfg),
    }
    dataset = to_dataset_dict(splits, data_cfg.src_lang, data_cfg.tgt_lang)
    manifest["build_seconds"] = round(time.monotonic() - start, 1)
    save_corpus(folder, dataset, manifest)
    log.info("corpus %s built in %.1f s", folder, manifest["build_seconds"])
    return folder


def load_corpus(data_cfg: Any) -> Any:
    """The built corpus as a DatasetDict (train, valid, test, test_long).

    Raises DataError naming the build command when the corpus is missing or was
    built with other data settings.
    """
    check_kind(data_cfg)
    folder = corpus_dir(data_cfg)
    dataset = load_dataset_dict(folder, data_cfg)
    manifest = read_manifest(folder) or {}
    if manifest.get("config_key") != config_key(data_cfg):
        from seq2seq.corpus.store import build_hint

        raise DataError(
            f"corpus {folder} was built with other data settings: {build_hint(data_cfg)} to rebuild it"
        )
    return dataset


def summary(folder: Path) -> str:
    """A few lines for the terminal: counts, buckets, realignment, drops."""
    m = read_manifest(folder) or {}
    lines = [f"corpus {folder} ({m.get('kind')}, build {m.get('build_key')}, {m.get('build_seconds')} s)"]
    lines.append("  pairs: " + ", ".join(f"{k} {v}" for k, v in m.get("counts", {}).items()))
    buckets = m.get("test_buckets", {})
    lines.append("  test by source length: " + ", ".join(f"{b}: {buckets.get(b, 0)}" for b in BUCKET_LABELS))
    align = m.get("alignment")
    if align:
        lines.append(f"  realigned pairs: {align['pairs_realigned']}; beads {align['beads']}")
    lines.append(f"  dropped: {m.get('dropped', {})}")
    if m.get("note"):
        lines.append(f"  note: {m['note']}")
    return "\n".join(lines)


def build_main(cfg: Any) -> Path:
    """`seq2seq-data`: build (or reuse) the corpus and its SentencePiece models."""
    from seq2seq.corpus.tokenizer import load_or_train

    folder = build_corpus(cfg.data)
    tokenizers = load_or_train(folder, cfg.tokenizer, cfg.data.src_lang, cfg.data.tgt_lang)
    print(summary(folder))
    print(
        f"  sentencepiece: {tokenizers.folder} (vocab {cfg.data.src_lang} {tokenizers.src.vocab_size}, "
        f"{cfg.data.tgt_lang} {tokenizers.tgt.vocab_size}, joint={tokenizers.joint})"
    )
    return folder
