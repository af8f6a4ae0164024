"""Helpers for the translate/REPL tests: a word-level tokenizer stand-in with a small
model (API and REPL tests in milliseconds), and a real run folder trained through
seq2seq-data and seq2seq-train on conftest's tiny corpus (for the command-line tests)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.inference.translator import Translator
from seq2seq.model import build_model

WORDS = ("en", "el", "principio", "creó", "dios", "los", "cielos", "y", "la", "tierra",
         "in", "the", "beginning", "god", "created", "heaven", "and", "earth")
SPECIALS = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


class WordTokenizer:
    """SentencePiece's interface over whole lower-cased words ("▁word" pieces)."""

    def __init__(self, words: tuple[str, ...] | list[str] = WORDS) -> None:
        self.words = list(words)
        self.ids = {w: i + len(SPECIALS) for i, w in enumerate(self.words)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(w.lower(), UNK_ID) for w in text.split()]

    def pieces(self, text: str) -> list[str]:
        return ["▁" + w for w in text.split()]

    def id_to_piece(self, i: int) -> str:
        return SPECIALS.get(i) or "▁" + self.words[i - len(SPECIALS)]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.id_to_piece(i).lstrip("▁") for i in ids if i not in SPECIALS)


class WordTokenizers:
    def __init__(self) -> None:
        self.src = WordTokenizer()
        self.tgt = WordTokenizer()


def word_translator(attention: str = "bahdanau", max_src_tokens: int = 50) -> Translator:
    """A Translator over an untrained (seeded, so deterministic) small model."""
    torch.manual_seed(0)
    toks = WordTokenizers()
    cfg = {"emb_size": 16, "hidden_size": 16, "dropout": 0.0, "attention": {"name": attention}}
    model = build_model(cfg, toks.src.vocab_size, toks.tgt.vocab_size).eval()
    return Translator(model, toks, max_src_tokens)


PAIRS = [
    ("en el principio", "in the beginning"),
    ("creó dios los cielos y la tierra", "god created the heaven and the earth"),
    ("dios", "god"),
    ("la tierra", "the earth"),
    ("los cielos", "the heaven"),
    ("y la tierra y los cielos", "and the earth and the heaven"),
]


@functools.cache
def trained_word_translator() -> Translator:
    """``word_translator()`` memorised on PAIRS (about 2 s on one core), shared by the tests:
    its outputs are real, non-empty translations ending in EOS."""
    translator = word_translator()
    model, toks = translator.model, translator.tokenizers
    src = [torch.tensor(toks.src.encode(s)) for s, _ in PAIRS]
    tgt = [toks.tgt.encode(t) for _, t in PAIRS]
    src_pad = pad_sequence(src, batch_first=True, padding_value=PAD_ID)
    src_lens = torch.tensor([len(s) for s in src])
    tgt_in = pad_sequence([torch.tensor([BOS_ID, *t]) for t in tgt], batch_first=True,
                          padding_value=PAD_ID)
    tgt_out = pad_sequence([torch.tensor([*t, EOS_ID]) for t in tgt], batch_first=True,
                           padding_value=PAD_ID)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only add overhead
    model.train()
    for _ in range(120):
        logits = model(src_pad, src_lens, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    torch.set_num_threads(threads)
    return translator


# ---------------------------------------------------------------- a real run folder


@functools.cache
def trained_run(train_overrides: tuple[str, ...]) -> Path:
    """A run folder (best.pt, last.pt, tokenizer/) trained for a few seconds by the real
    seq2seq-train on conftest's tiny corpus (``tiny_train_overrides``); once per process,
    so test_translate and test_repl share it."""
    from conftest import train_in_process

    root = Path(tempfile.mkdtemp(prefix="seq2seq-translate-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return train_in_process([*train_overrides, "model.emb_size=32", "model.hidden_size=32",
                             "train.max_steps=150", "train.lr=0.01", "train.valid_every=75",
                             "train.valid_bleu_sentences=0", f"run_dir={root / 'run'}"])
