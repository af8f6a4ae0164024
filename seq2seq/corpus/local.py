"""Your own parallel files: TSV (``src<TAB>tgt``) or JSONL, one pair per line.

JSONL lines are ``{"translation": {"<src>": ..., "<tgt>": ...}}`` (the Hugging Face
layout) or ``{"<src>": ..., "<tgt>": ...}``. A problem is reported with the file and
line number, never as a traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from seq2seq.corpus.pair import Pair
from seq2seq.errors import DataError

GROUP_LINES = 20  # lines per split unit, so neighbouring lines stay in one split


def _decode(path: Path, raw: bytes, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}:{lineno}: invalid UTF-8 at byte {err.start}: save the file as UTF-8"
        ) from None


def _parse_tsv(path: Path, line: str, lineno: int) -> tuple[str, str]:
    fields = line.split("\t")
    if len(fields) != 2:
        raise DataError(
            f"{path}:{lineno}: expected 2 tab-separated columns (source<TAB>target), "
            f"found {len(fields)}: fix the line or remove it"
        )
    return fields[0], fields[1]


def _parse_jsonl(path: Path, line: str, lineno: int, src: str, tgt: str) -> tuple[str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg}): one object per line") from None
    if isinstance(record, dict) and isinstance(record.get("translation"), dict):
        record = record["translation"]
    if not isinstance(record, dict) or src not in record or tgt not in record:
        raise DataError(
            f'{path}:{lineno}: expected {{"translation": {{"{src}": ..., "{tgt}": ...}}}} '
            f'or {{"{src}": ..., "{tgt}": ...}}: set data.src_lang/data.tgt_lang to the keys used'
        )
    return str(record[src]), str(record[tgt])


def read_pairs(path: Path, src_lang: str, tgt_lang: str, split: str) -> list[Pair]:
    """Every line of ``path`` as a Pair; groups are blocks of ``GROUP_LINES`` lines."""
    if not path.is_file():
        raise DataError(f"{path}: file not found: check data.{split}_file")
    is_jsonl = path.suffix.lower() in (".jsonl", ".json")
    pairs: list[Pair] = []
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            line = _decode(path, raw, lineno).rstrip("\r\n")
            if not line.strip():
                raise DataError(f"{path}:{lineno}: empty line: remove it (one pair per line)")
            if is_jsonl:
                src, tgt = _parse_jsonl(path, line, lineno, src_lang, tgt_lang)
            else:
                src, tgt = _parse_tsv(path, line, lineno)
            src, tgt = " ".join(src.split()), " ".join(tgt.split())
            if not src or not tgt:
                side = "source" if not src else "target"
                raise DataError(f"{path}:{lineno}: empty {side} side: give both sides or remove the line")
            pairs.append(
                Pair(src, tgt, ref=f"{path.name}:{lineno}",
                     group=f"{split}:{(lineno - 1) // GROUP_LINES}", pos=lineno)
            )
    if not pairs:
        raise DataError(f"{path}: no pairs in the file: one source<TAB>target pair per line")
    return pairs


def local_files(data_cfg: Any) -> dict[str, Path]:
    """The configured files by split; train is required."""
    if not data_cfg.train_file:
        raise DataError(
            "data=local needs a training file: add data.train_file=<pairs.tsv or .jsonl>"
        )
    files = {"train": data_cfg.train_file, "valid": data_cfg.valid_file, "test": data_cfg.test_file}
    return {split: Path(f).expanduser() for split, f in files.items() if f}


def fingerprint(data_cfg: Any) -> dict[str, str]:
    """SHA-256 of each input file, so an edited file triggers a rebuild."""
    out = {}
    for split, path in local_files(data_cfg).items():
        if not path.is_file():
            raise DataError(f"{path}: file not found: check data.{split}_file")
        out[split] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def read_local(data_cfg: Any) -> dict[str, list[Pair]]:
    """Pairs of each configured file, keyed by split."""
    return {
        split: read_pairs(path, data_cfg.src_lang, data_cfg.tgt_lang, split)
        for split, path in local_files(data_cfg).items()
    }
