"""data=hub: conversion of a Hugging Face DatasetDict, and the offline error."""

from pathlib import Path

import datasets
import pytest
from datasets.exceptions import DatasetNotFoundError
from omegaconf import OmegaConf

from seq2seq.config import DataConfig
from seq2seq.corpus import build_corpus, load_corpus
from seq2seq.corpus.hub import hub_pairs
from seq2seq.errors import DataError

FIXTURES = Path(__file__).parent / "fixtures"


def _cfg(tmp_path: Path, **kw):
    values = {"name": "books", "kind": "hub", "root": str(tmp_path), "hub_name": "opus_books",
              "hub_config": "en-es", "test_per_bucket": 5, "valid_size": 10, **kw}
    return OmegaConf.structured(DataConfig(**values))


def _fake_hub(n_train: int = 60) -> datasets.DatasetDict:
    lines = (FIXTURES / "genesis_es_en.tsv").read_text(encoding="utf-8").splitlines()
    pairs = [line.split("\t") for line in lines]

    def split(rows):
        return datasets.Dataset.from_dict(
            {"id": [str(i) for i in range(len(rows))],
             "translation": [{"en": en, "es": es} for es, en in rows]}
        )

    return datasets.DatasetDict(
        {"train": split(pairs[:n_train]), "validation": split(pairs[n_train:n_train + 10]),
         "test": split(pairs[n_train + 10:n_train + 30])}
    )


def test_translation_layout_is_converted() -> None:
    out = hub_pairs(_fake_hub(), "es", "en")
    assert {k: len(v) for k, v in out.items()} == {"train": 60, "valid": 10, "test": 20}
    first = out["train"][0]
    assert first.src.startswith("EN el principio") and first.tgt.startswith("In the beginning")
    assert first.ref == "train:0"


def test_flat_columns_are_converted() -> None:
    flat = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"es": ["hola  mundo"], "en": ["hello world"]})})
    pair = hub_pairs(flat, "es", "en")["train"][0]
    assert (pair.src, pair.tgt) == ("hola mundo", "hello world")


def test_wrong_language_codes_are_named() -> None:
    with pytest.raises(DataError, match=r"no 'fr'/'en' texts .*found \['en', 'es'\].*data.src_lang"):
        hub_pairs(_fake_hub(), "fr", "en")


def test_build_from_a_hub_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def fake_load(name, config=None, **kw):
        calls.append((name, config))
        return _fake_hub()

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = _cfg(tmp_path)
    build_corpus(cfg)
    ds = load_corpus(cfg)
    assert calls == [("opus_books", "en-es")]
    assert (ds["train"].num_rows, ds["valid"].num_rows, ds["test"].num_rows) == (60, 10, 20)


def test_offline_hub_says_so_and_suggests_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def offline(*args, **kw):  # what datasets raises when the Hub is unreachable
        raise ConnectionError("Couldn't reach 'opus_books' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"could not download the Hugging Face dataset opus_books.*data=local"):
        build_corpus(_cfg(tmp_path))


def test_unknown_hub_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(*args, **kw):
        raise DatasetNotFoundError("Dataset 'nope' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(DataError, match=r"not found .*check data.hub_name"):
        build_corpus(_cfg(tmp_path, hub_name="nope"))


def test_hub_without_a_name(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data.hub_name"):
        build_corpus(_cfg(tmp_path, hub_name=None))
