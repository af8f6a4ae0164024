"""SentencePiece models: trained on the train split only, cached under the corpus folder.

Ids follow seq2seq/constants.py: PAD=0, UNK=1, BOS=2, EOS=3. ``encode`` adds no BOS/EOS;
batching adds them. Default: one model per side (``tokenizer.joint=false``) of 8000
pieces each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm
from omegaconf import DictConfig, OmegaConf

from seq2seq import atomic
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.errors import DataError

log = logging.getLogger(__name__)

TOKENIZER_VERSION = 1  # bump when training options below change
MAX_TRAIN_SENTENCES = 300_000  # SentencePiece samples this many lines of a larger corpus
SEED = 1  # SentencePiece's sampling and seeding are random otherwise
_META = "tokenizers.json"


class SpmTokenizer:
    """One SentencePiece model; picklable (it carries the model bytes)."""

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def load(cls, path: Path) -> SpmTokenizer:
        """DataError naming the file when it is missing or not a SentencePiece model."""
        try:
            return cls(Path(path).read_bytes())
        except (OSError, RuntimeError) as err:  # sentencepiece refuses a damaged model
            raise DataError(f"{path} is missing or not a SentencePiece model ({type(err).__name__}): "
                            "copy the run's tokenizer/ back from a backup, or retrain the run") from None

    def save(self, path: Path) -> None:
        atomic.write_bytes(path, self.model_proto)

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``; no BOS/EOS."""
        return self._sp.encode(text, out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; PAD/BOS/EOS are control symbols and decode to nothing."""
        return self._sp.decode([int(i) for i in ids])

    def pieces(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def __getstate__(self) -> dict[str, Any]:
        return {"model_proto": self.model_proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["model_proto"])


@dataclass
class Tokenizers:
    """Source and target tokenizers (the same object when the vocabulary is joint)."""

    src: SpmTokenizer
    tgt: SpmTokenizer
    joint: bool = False
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    folder: Path | None = None  # where they were loaded from

    def save(self, folder: Path) -> None:
        """Copy both models into ``folder`` so a run folder is self-contained."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.src.save(folder / "spm_src.model")
        self.tgt.save(folder / "spm_tgt.model")
        meta = {"joint": self.joint, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang}
        atomic.write_json(folder / _META, meta, indent=2)

    def identity(self) -> str:
        """sha256 (16 hex digits) of both SentencePiece models: equal exactly when two runs
        map text to the same ids both ways (what an ensemble needs)."""
        digest = hashlib.sha256(self.src.model_proto)
        digest.update(b"joint" if self.joint else self.tgt.model_proto)
        return digest.hexdigest()[:16]

    @classmethod
    def load(cls, folder: Path) -> Tokenizers:
        folder = Path(folder)
        meta_path = folder / _META
        if not meta_path.is_file():
            raise DataError(
                f"no tokenizers in {folder} ({_META} missing): run `seq2seq-data` to train them"
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            joint = bool(meta["joint"])
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{meta_path} is damaged: copy the run's tokenizer/ back from a "
                            "backup, or retrain the run") from None
        src = SpmTokenizer.load(folder / "spm_src.model")
        tgt = src if joint else SpmTokenizer.load(folder / "spm_tgt.model")
        return cls(src, tgt, joint, meta.get("src_lang", "src"), meta.get("tgt_lang", "tgt"), folder)


def _settings(tok_cfg: Any) -> dict[str, Any]:
    if isinstance(tok_cfg, DictConfig):
        return dict(OmegaConf.to_container(tok_cfg, resolve=True, enum_to_str=True))
    if dataclasses.is_dataclass(tok_cfg):
        return dataclasses.asdict(tok_cfg)
    return dict(tok_cfg)


def cache_key(tok_cfg: Any, corpus_key: str, src_lang: str, tgt_lang: str) -> str:
    """Hash of the tokenizer settings and the corpus build they are trained on."""
    blob = json.dumps(
        {"v": TOKENIZER_VERSION, "tok": _settings(tok_cfg), "corpus": corpus_key, "langs": [src_lang, tgt_lang]},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_model(lines: Sequence[str], tok_cfg: Any, prefix: Path) -> Path:
    """Train one SentencePiece model on ``lines``; returns the .model path.

    ``hard_vocab_limit=False`` lets a small corpus end with fewer pieces than asked
    instead of failing.
    """
    if not lines:
        raise DataError("cannot train SentencePiece: the train split is empty")
    corpus_file = prefix.with_suffix(".txt")
    corpus_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.set_random_generator_seed(SEED)
    spm.SentencePieceTrainer.train(
        input=str(corpus_file),
        model_prefix=str(prefix),
        vocab_size=int(tok_cfg.vocab_size),
        model_type=str(tok_cfg.model_type),
        character_coverage=float(tok_cfg.character_coverage),
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        hard_vocab_limit=False,
        input_sentence_size=MAX_TRAIN_SENTENCES,
        shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,  # warnings only; the build logs its own progress
    )
    corpus_file.unlink()
    return prefix.with_suffix(".model")


def _load_trained(path: Path) -> SpmTokenizer:
    """Load a freshly trained model; its bytes are saved again under the public name."""
    tokenizer = SpmTokenizer.load(path)
    path.unlink()
    return tokenizer


def _train_texts(corpus_path: Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    import datasets

    try:
        train = datasets.load_from_disk(str(corpus_path / "dataset"))["train"]
    except (OSError, KeyError, ValueError) as err:
        raise DataError(f"corpus {corpus_path} has no train split ({err}): run `seq2seq-data`") from None
    pairs = train["translation"]
    return [p[src_lang] for p in pairs], [p[tgt_lang] for p in pairs]


def _train_all(folder: Path, corpus_path: Path, tok_cfg: Any, src_lang: str, tgt_lang: str) -> Tokenizers:
    src_lines, tgt_lines = _train_texts(corpus_path, src_lang, tgt_lang)
    if tok_cfg.joint:
        joint = _load_trained(train_model(src_lines + tgt_lines, tok_cfg, folder / "joint"))
        return Tokenizers(joint, joint, True, src_lang, tgt_lang)
    src = _load_trained(train_model(src_lines, tok_cfg, folder / "src"))
    tgt = _load_trained(train_model(tgt_lines, tok_cfg, folder / "tgt"))
    return Tokenizers(src, tgt, False, src_lang, tgt_lang)


def load_or_train(corpus_path: Path, tok_cfg: Any, src_lang: str, tgt_lang: str) -> Tokenizers:
    """Tokenizers for the corpus at ``corpus_path``, trained on its train split.

    Cached in ``corpus_path/spm/<key>/``; the key covers the tokenizer settings and
    the corpus build key, so a changed corpus or setting trains new models and an
    unchanged one reuses them.
    """
    corpus_path = Path(corpus_path)
    manifest_path = corpus_path / "manifest.json"
    if not manifest_path.is_file():
        raise DataError(f"corpus {corpus_path} not found: run `seq2seq-data` first")
    corpus_key = json.loads(manifest_path.read_text(encoding="utf-8"))["build_key"]
    key = cache_key(tok_cfg, corpus_key, src_lang, tgt_lang)
    folder = corpus_path / "spm" / key
    if (folder / _META).is_file():
        log.info("reusing SentencePiece models in %s", folder)
        return Tokenizers.load(folder)
    log.info("training SentencePiece models (%s) into %s", _settings(tok_cfg), folder)
    with atomic.atomic_folder(folder, keep_existing=True) as tmp:  # another process may win
        tokenizers = _train_all(tmp, corpus_path, tok_cfg, src_lang, tgt_lang)
        tokenizers.save(tmp)
        (tmp / "settings.json").write_text(
            json.dumps({"tokenizer": _settings(tok_cfg), "corpus_build_key": corpus_key}, indent=2) + "\n",
            encoding="utf-8",
        )
    return Tokenizers.load(folder)
