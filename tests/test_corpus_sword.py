"""The SWORD reader's errors and quirks; one slow test builds the real corpus."""

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seq2seq.config import DataConfig, TokenizerConfig
from seq2seq.corpus import build_corpus, load_corpus
from seq2seq.corpus.splits import BUCKET_LABELS
from seq2seq.corpus.sword import SwordLibrary, Verse, drop_subscription, resolve_sword_path
from seq2seq.errors import DataError


def _cfg(tmp_path: Path, **kw):
    values = {"name": "bible_es_en", "kind": "sword", "root": str(tmp_path), **kw}
    return OmegaConf.structured(DataConfig(**values))


def test_missing_modules_say_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no SWORD modules at .*make install.*SWORD_PATH"):
        build_corpus(_cfg(tmp_path, sword_path=str(tmp_path / "nowhere")))


def test_missing_module_lists_what_is_installed(tmp_path: Path) -> None:
    (tmp_path / "mods.d").mkdir()
    (tmp_path / "mods.d" / "other.conf").write_text("[OtherBible]\nModDrv=zText\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"spaRV1909eb not found .*installed: OtherBible.*make install"):
        SwordLibrary(tmp_path).info("spaRV1909eb")


def test_sword_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWORD_PATH", "/from/env")
    assert resolve_sword_path("/from/config") == Path("/from/config")
    assert resolve_sword_path(None) == Path("/from/env")
    monkeypatch.delenv("SWORD_PATH")
    assert resolve_sword_path(None) == Path("/usr/share/sword")


def test_epistle_subscription_is_cut() -> None:
    verses = [
        Verse("Titus", 3, 14, "Y aprendan asimismo los nuestros."),
        Verse("Titus", 3, 15, "La gracia sea con todos vosotros. Amén. A Tito, escrita de Nicópolis."),
    ]
    assert drop_subscription(verses)[-1].text == "La gracia sea con todos vosotros. Amén."
    gospel = [Verse("Matt", 28, 20, "hasta el fin del mundo. Amén. Otra cosa.")]
    assert drop_subscription(gospel) == gospel  # only the epistles carry subscriptions


def _modules_installed() -> bool:
    mods = resolve_sword_path(os.environ.get("SWORD_PATH")) / "mods.d"
    confs = {p.name.lower() for p in mods.glob("*.conf")} if mods.is_dir() else set()
    return {"sparv1909eb.conf", "engkjv2006eb.conf"} <= confs


@pytest.mark.slow
@pytest.mark.skipif(not _modules_installed(), reason="SWORD modules not installed (make install)")
def test_real_corpus_build(tmp_path: Path) -> None:
    from seq2seq.corpus.tokenizer import load_or_train

    cfg = _cfg(tmp_path)
    folder = build_corpus(cfg)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["sources"]["source"]["name"] == "spaRV1909eb"
    assert sum(manifest["counts"][s] for s in ("train", "valid", "test")) > 30_000
    assert all(manifest["test_buckets"][b] >= 150 for b in BUCKET_LABELS)
    refs = set(manifest["alignment"]["realigned_refs"])
    for ref in ("Num.13.1=Num.12.16", "Num.30.1=Num.29.40", "1Sam.24.1=1Sam.23.29",
                "1Kgs.22.45=1Kgs.22.44", "1Chr.21.17=1Chr.21.16", "2Chr.33.11=2Chr.33.12",
                "Hos.12.1=Hos.11.12", "Jonah.2.1=Jonah.1.17"):
        assert ref in refs
    ds = load_corpus(cfg)
    lengths = [len(t["es"].split()) for t in ds["test_long"]["translation"]]
    assert lengths and min(lengths) >= 60 and max(lengths) <= 120
    tokenizers = load_or_train(folder, TokenizerConfig(), "es", "en")
    assert tokenizers.src.vocab_size == tokenizers.tgt.vocab_size == 8000
