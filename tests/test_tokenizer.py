"""SentencePiece: special ids, round trip, train-split only, cache reuse, save/load."""

import pickle
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import seq2seq.corpus.tokenizer as tok
from seq2seq.config import DataConfig, TokenizerConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.corpus import build_corpus
from seq2seq.errors import DataError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Genesis 1-6 as train; a test file in a script the train split never uses."""
    root = tmp_path_factory.mktemp("data")
    test_file = root / "test.tsv"
    test_file.write_text("жжж ёёё\tzzz\n" * 5, encoding="utf-8")
    cfg = OmegaConf.structured(
        DataConfig(name="gen", kind="local", root=str(root), train_file=str(FIXTURES / "genesis_es_en.tsv"),
                   test_file=str(test_file), valid_size=10)
    )
    return build_corpus(cfg)


def _cfg(**kw) -> TokenizerConfig:
    return TokenizerConfig(**{"vocab_size": 300, **kw})


def test_special_ids_and_round_trip(corpus: Path) -> None:
    toks = tok.load_or_train(corpus, _cfg(), "es", "en")
    for t in (toks.src, toks.tgt):
        assert [t.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]
    text = "Y dijo Dios: Sea la luz: y fué la luz."
    ids = toks.src.encode(text)
    assert ids and BOS_ID not in ids and EOS_ID not in ids
    assert toks.src.decode(ids) == text
    assert toks.src.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == text  # control ids decode to nothing
    assert "".join(toks.tgt.pieces("And God said")).replace("▁", " ").strip() == "And God said"
    assert toks.src is not toks.tgt and not toks.joint


def test_trained_on_the_train_split_only(corpus: Path) -> None:
    toks = tok.load_or_train(corpus, _cfg(), "es", "en")
    # character_coverage=1.0 would have given Cyrillic pieces had test.tsv been seen
    assert UNK_ID in toks.src.encode("жжж")


def test_cache_is_reused_and_keyed_by_settings(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tok.load_or_train(corpus, _cfg(), "es", "en")

    def no_training(*args, **kw):
        raise AssertionError("retrained although nothing changed")

    monkeypatch.setattr(tok, "train_model", no_training)
    again = tok.load_or_train(corpus, _cfg(), "es", "en")
    assert again.folder == first.folder
    assert again.src.encode("la luz") == first.src.encode("la luz")
    monkeypatch.undo()
    other = tok.load_or_train(corpus, _cfg(vocab_size=250), "es", "en")
    assert other.folder != first.folder and other.folder.parent == corpus / "spm"


def test_joint_vocabulary(corpus: Path) -> None:
    toks = tok.load_or_train(corpus, _cfg(joint=True), "es", "en")
    assert toks.joint and toks.src is toks.tgt
    assert UNK_ID not in toks.src.encode("Dios") + toks.tgt.encode("God")


def test_save_load_is_self_contained(corpus: Path, tmp_path: Path) -> None:
    toks = tok.load_or_train(corpus, _cfg(), "es", "en")
    run = tmp_path / "run"
    toks.save(run)
    assert sorted(p.name for p in run.iterdir()) == ["spm_src.model", "spm_tgt.model", "tokenizers.json"]
    loaded = tok.Tokenizers.load(run)
    assert (loaded.src_lang, loaded.tgt_lang) == ("es", "en")
    assert loaded.tgt.encode("the light") == toks.tgt.encode("the light")
    clone = pickle.loads(pickle.dumps(loaded.src))
    assert clone.encode("la tierra") == toks.src.encode("la tierra")


def test_missing_corpus_or_tokenizers(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found: run `seq2seq-data`"):
        tok.load_or_train(tmp_path / "nothing", _cfg(), "es", "en")
    with pytest.raises(DataError, match="no tokenizers in"):
        tok.Tokenizers.load(tmp_path)
