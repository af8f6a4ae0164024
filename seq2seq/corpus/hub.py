"""A Hugging Face Hub dataset in the translation layout (wmt14, iwslt2017, opus_books, ...)."""

from __future__ import annotations

from typing import Any

from seq2seq.corpus.local import GROUP_LINES
from seq2seq.corpus.pair import Pair
from seq2seq.errors import DataError

# Hub split names -> ours.
SPLIT_NAMES = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}


def load_hub(data_cfg: Any) -> Any:
    """``datasets.load_dataset(hub_name, hub_config)``; user errors become DataError."""
    import datasets

    if not data_cfg.hub_name:
        raise DataError("data=hub needs a dataset name: add data.hub_name=<name> (e.g. wmt14)")
    name = f"{data_cfg.hub_name}" + (f" ({data_cfg.hub_config})" if data_cfg.hub_config else "")
    try:
        return datasets.load_dataset(data_cfg.hub_name, data_cfg.hub_config)
    except ConnectionError as err:
        raise DataError(
            f"could not download the Hugging Face dataset {name} ({err}): this machine cannot "
            "reach the Hub; use data=local with TSV/JSONL files instead"
        ) from None
    except FileNotFoundError as err:  # DatasetNotFoundError, a missing config's files
        raise DataError(
            f"Hugging Face dataset {name} not found ({err}): check data.hub_name and "
            "data.hub_config, or use data=local"
        ) from None
    except OSError as err:  # other network failures (timeouts, HTTP errors)
        raise DataError(
            f"could not download the Hugging Face dataset {name} ({err}): check the network "
            "or use data=local with TSV/JSONL files instead"
        ) from None
    except ValueError as err:  # e.g. an unknown config name; the message lists the valid ones
        raise DataError(f"Hugging Face dataset {name}: {err}: check data.hub_config") from None


def _texts(example: dict[str, Any], src: str, tgt: str, where: str) -> tuple[str, str]:
    record = example.get("translation", example)
    if not isinstance(record, dict) or src not in record or tgt not in record:
        keys = sorted(record) if isinstance(record, dict) else list(example)
        raise DataError(
            f"{where}: no '{src}'/'{tgt}' texts (found {keys}): set data.src_lang/data.tgt_lang "
            "to the dataset's language codes"
        )
    return " ".join(str(record[src]).split()), " ".join(str(record[tgt]).split())


def hub_pairs(dataset: Any, src_lang: str, tgt_lang: str) -> dict[str, list[Pair]]:
    """Pairs of each split of a DatasetDict, keyed by our split names (train/valid/test)."""
    out: dict[str, list[Pair]] = {}
    for hub_split, ds in dataset.items():
        split = SPLIT_NAMES.get(hub_split)
        if split is None:
            continue  # extra splits (e.g. "challenge") are not ours to guess
        pairs = out.setdefault(split, [])
        for idx, example in enumerate(ds):
            src, tgt = _texts(example, src_lang, tgt_lang, f"{hub_split}[{idx}]")
            pairs.append(
                Pair(src, tgt, ref=f"{hub_split}:{idx}",
                     group=f"{hub_split}:{idx // GROUP_LINES}", pos=idx)
            )
    if "train" not in out:
        raise DataError(f"the dataset has no train split (splits: {list(dataset)}): use data=local")
    return out


def read_hub(data_cfg: Any) -> dict[str, list[Pair]]:
    return hub_pairs(load_hub(data_cfg), data_cfg.src_lang, data_cfg.tgt_lang)


def fingerprint(data_cfg: Any) -> dict[str, str | None]:
    return {"hub_name": data_cfg.hub_name, "hub_config": data_cfg.hub_config}
