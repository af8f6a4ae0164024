"""Shared fixtures: a tiny built corpus (data=local) with its SentencePiece models.

The corpus is a toy Spanish->English word-for-word language, built once per test
session through the real corpus builder and tokenizer, so training tests run the
same code path as `seq2seq-data` + `seq2seq-train` on a few hundred pairs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from seq2seq.config import CONFIG_DIR, register_configs

# Hydra's ConfigStore needs the schemas before any compose() (the CLI does this on import).
register_configs()

LEXICON = {
    "el": "the", "la": "the", "perro": "dog", "gato": "cat", "casa": "house", "come": "eats",
    "ve": "sees", "grande": "big", "pequeño": "small", "rojo": "red", "y": "and", "un": "a",
    "una": "a", "rio": "river", "pan": "bread", "agua": "water", "bebe": "drinks", "niño": "boy",
    "niña": "girl", "camina": "walks", "por": "through", "ciudad": "city", "hoy": "today",
    "mañana": "tomorrow", "dice": "says", "que": "that", "rey": "king", "tierra": "land",
}


def toy_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = sorted(LEXICON)
    pairs = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(1, 14))]
        pairs.append((" ".join(src), " ".join(LEXICON[w] for w in src)))
    return pairs


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> list[str]:
    """Hydra overrides that select a built tiny corpus (train 600, valid 40, test 40 pairs)."""
    from seq2seq.corpus import build_corpus
    from seq2seq.corpus.tokenizer import load_or_train

    root = tmp_path_factory.mktemp("corpus")
    files = {split: write_tsv(root / f"{split}.tsv", toy_pairs(n, seed))
             for split, n, seed in (("train", 600, 1), ("valid", 40, 2), ("test", 40, 3))}
    overrides = [
        "data=local", "data.name=tiny", f"data.root={root / 'data'}",
        *(f"data.{split}_file={path}" for split, path in files.items()),
        "tokenizer.vocab_size=64",
    ]
    cfg = compose_config(overrides)
    folder = build_corpus(cfg.data)
    load_or_train(folder, cfg.tokenizer, cfg.data.src_lang, cfg.data.tgt_lang)
    return overrides


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def train_in_process(overrides: list[str]) -> Path:
    """`seq2seq-train overrides` run in this process, through the library (no process-wide
    settings: those are the command line's, seq2seq.runtime.apply_training_settings)."""
    from seq2seq.training.loop import train_main

    return train_main(compose_config(overrides))


@pytest.fixture(scope="session")
def tiny_train_overrides(tiny_corpus: list[str]) -> list[str]:
    """A tiny model and a short, fully deterministic schedule on the tiny corpus."""
    return [
        *tiny_corpus,
        "model.emb_size=16", "model.hidden_size=16", "model.dropout=0.1",
        "train.batch_tokens=200", "train.valid_every=5", "train.log_every=2",
        "train.valid_bleu_sentences=10", "train.patience=0", "train.threads=1",
        "train.device=cpu", "train.tensorboard=false",  # on in test_board.py only
    ]


@pytest.fixture(scope="session")
def onednn_rel_error() -> float:
    """The relative error a product forced through oneDNN's fp32 route may have on this
    CPU: fp32 rounding where oneDNN keeps fp32 arithmetic, bf16 inputs' where its "fp32"
    products take them (AMX; ``gemm.choose`` then refuses the route, so only tests that
    force it meet it)."""
    from seq2seq.model import gemm

    if not gemm.available():
        return 1e-5
    measured = gemm.measure(((64, 256, 256),), rounds=1)["onednn"]["rel_error"]
    return 1e-5 if measured <= gemm.MAX_REL_ERROR else 1e-2
