"""data=local: TSV/JSONL reading, its error messages, and a full build + load."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seq2seq.config import DataConfig
from seq2seq.corpus import build_corpus, corpus_dir, load_corpus
from seq2seq.corpus.local import read_pairs
from seq2seq.errors import ConfigError, DataError

FIXTURES = Path(__file__).parent / "fixtures"
TSV = FIXTURES / "genesis_es_en.tsv"
JSONL = FIXTURES / "genesis_es_en.jsonl"


def _cfg(tmp_path: Path, **kw):
    values = {"name": "gen", "kind": "local", "root": str(tmp_path), "train_file": str(TSV),
              "test_per_bucket": 5, "valid_size": 10, **kw}
    return OmegaConf.structured(DataConfig(**values))


def test_tsv_lines_become_pairs() -> None:
    pairs = read_pairs(TSV, "es", "en", "train")
    assert len(pairs) == 160
    assert pairs[0].src.startswith("EN el principio crió Dios")
    assert pairs[0].tgt == "In the beginning God created the heaven and the earth."
    assert pairs[0].ref == "genesis_es_en.tsv:1"
    assert pairs[20].group == pairs[39].group != pairs[40].group  # blocks of 20 lines


def test_jsonl_in_both_layouts() -> None:
    pairs = read_pairs(JSONL, "es", "en", "train")
    tsv = read_pairs(TSV, "es", "en", "train")
    assert [(p.src, p.tgt) for p in pairs] == [(p.src, p.tgt) for p in tsv[:20]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"uno\tone\ndos\tuno\ttwo\n", "bad.tsv:2: expected 2 tab-separated columns"),
        (b"uno\tone\n\ntres\tthree\n", "bad.tsv:2: empty line"),
        (b"uno\tone\ndos\t  \n", "bad.tsv:2: empty target side"),
        (b"uno\tone\n\xff\xfe\tx\n", "bad.tsv:2: invalid UTF-8"),
        (b"", "no pairs in the file"),
    ],
)
def test_bad_tsv_names_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message.replace("\t", r"\t")):
        read_pairs(path, "es", "en", "train")


def test_bad_jsonl_names_the_expected_keys(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"fr": "un", "en": "one"}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected .*data.src_lang"):
        read_pairs(path, "es", "en", "train")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope.tsv: file not found: check data.train_file"):
        read_pairs(tmp_path / "nope.tsv", "es", "en", "train")
    with pytest.raises(DataError, match="data.train_file"):
        build_corpus(_cfg(tmp_path, train_file=None))


def test_build_then_load(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    folder = build_corpus(cfg)
    assert folder == corpus_dir(cfg) == tmp_path / "gen"
    ds = load_corpus(cfg)
    assert list(ds) == ["train", "valid", "test", "test_long"]
    assert ds["train"].column_names == ["translation", "ref"]
    assert set(ds["train"][0]["translation"]) == {"es", "en"}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sum(manifest["counts"][s] for s in ("train", "valid", "test")) == 160
    # the file has no long verses: the shortfall is said, not hidden
    assert manifest["test_bucket_shortfall"]["51+"] == 5
    assert "note" in manifest
    test_groups = {r.rsplit(":", 1)[1] for r in ds["test"]["ref"]}
    assert not test_groups & {r.rsplit(":", 1)[1] for r in ds["train"]["ref"]}


def test_rebuild_is_skipped_unless_something_changed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    folder = build_corpus(cfg)
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    build_corpus(cfg)
    assert (folder / "manifest.json").stat().st_mtime_ns == stamp
    build_corpus(_cfg(tmp_path, max_len_ratio=3.0))
    assert (folder / "manifest.json").stat().st_mtime_ns != stamp


def test_given_valid_and_test_files_are_used_as_is(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, valid_file=str(JSONL), test_file=str(JSONL))
    build_corpus(cfg)
    ds = load_corpus(cfg)
    assert ds["valid"].num_rows == ds["test"].num_rows == 20
    assert ds["train"].num_rows == 160


def test_load_before_build_names_the_command(tmp_path: Path) -> None:
    cfg = OmegaConf.structured(DataConfig(name="bible_es_en", kind="sword", root=str(tmp_path)))
    with pytest.raises(DataError, match=r"bible_es_en not found: run `seq2seq-data data=bible_es_en`"):
        load_corpus(cfg)


def test_load_with_other_settings_asks_for_a_rebuild(tmp_path: Path) -> None:
    build_corpus(_cfg(tmp_path))
    with pytest.raises(DataError, match="built with other data settings"):
        load_corpus(_cfg(tmp_path, max_words=50))


def test_unknown_kind_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.kind='csv' is unknown: use one of sword, local, hub"):
        build_corpus(_cfg(tmp_path, kind="csv"))
