"""Where a built corpus lives and how it is written and read back.

``data/<name>/dataset`` is a ``datasets.DatasetDict`` (splits train, valid, test,
test_long; columns ``translation`` = {src_lang: text, tgt_lang: text} and ``ref``),
``data/<name>/manifest.json`` says how it was made.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq import atomic
from seq2seq.corpus.pair import Pair
from seq2seq.errors import DataError

SPLITS = ("train", "valid", "test", "test_long")
MANIFEST = "manifest.json"
DATASET = "dataset"
SHARD_BYTES = 500 * 2**20  # datasets' default maximum shard size


def corpus_dir(data_cfg: Any) -> Path:
    """``<data.root>/<data.name>``: the corpus folder."""
    return Path(data_cfg.root).expanduser() / data_cfg.name


def build_hint(data_cfg: Any) -> str:
    """The command that (re)builds this corpus."""
    if data_cfg.kind == "sword":
        return f"run `seq2seq-data data={data_cfg.name}`"
    return f"run `seq2seq-data data={data_cfg.kind} data.name={data_cfg.name} ...` with the same settings"


def to_dataset_dict(splits: dict[str, Sequence[Pair]], src_lang: str, tgt_lang: str) -> Any:
    """Pairs -> DatasetDict in the Hugging Face translation layout."""
    import datasets

    features = datasets.Features(
        {
            "translation": datasets.Translation(languages=[src_lang, tgt_lang]),
            "ref": datasets.Value("string"),
        }
    )
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict(
                {
                    "translation": [{src_lang: p.src, tgt_lang: p.tgt} for p in pairs],
                    "ref": [p.ref for p in pairs],
                },
                features=features,
            )
            for name, pairs in splits.items()
        }
    )


def save_corpus(folder: Path, dataset: Any, manifest: dict[str, Any]) -> None:
    """Write dataset and manifest, replacing an older build only once the new one is complete.

    Other files in the folder (Hydra's log) stay; SentencePiece caches of an older
    build are removed, their key no longer matches.
    """
    import datasets

    datasets.disable_progress_bars()  # four bars for a sub-second write are noise
    # At least one shard per split: datasets cannot read back an empty split saved
    # with zero shards (a test_long of a small corpus can be empty).
    shards = {name: max(1, math.ceil(ds.data.nbytes / SHARD_BYTES)) for name, ds in dataset.items()}
    try:
        with atomic.atomic_folder(folder / DATASET) as tmp:
            dataset.save_to_disk(str(tmp), num_shards=shards)
    finally:
        datasets.enable_progress_bars()
    shutil.rmtree(folder / "spm", ignore_errors=True)
    atomic.write_json(folder / MANIFEST, manifest, indent=2, ensure_ascii=False)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a complete build in ``folder``, or None."""
    path = folder / MANIFEST
    if not path.is_file() or not (folder / DATASET).is_dir():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def load_dataset_dict(folder: Path, data_cfg: Any) -> Any:
    """The saved DatasetDict; DataError naming the build command when it is missing."""
    import datasets

    if read_manifest(folder) is None:
        raise DataError(f"corpus {folder} not found: {build_hint(data_cfg)}")
    try:
        return datasets.load_from_disk(str(folder / DATASET))
    except (OSError, ValueError) as err:
        raise DataError(f"corpus {folder} is unreadable ({err}): {build_hint(data_cfg)}") from None
