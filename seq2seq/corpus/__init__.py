"""Parallel corpora: the embedded SWORD Bibles, local TSV/JSONL files, Hugging Face datasets.

Build with ``seq2seq-data`` (:func:`seq2seq.corpus.build.build_main`); read with
:func:`load_corpus`, which returns a ``datasets.DatasetDict`` with splits ``train``,
``valid``, ``test`` and ``test_long`` and columns ``translation`` ({src_lang: text,
tgt_lang: text}) and ``ref``.
"""

from seq2seq.corpus.build import KINDS, build_corpus, load_corpus
from seq2seq.corpus.store import corpus_dir

__all__ = ["KINDS", "build_corpus", "corpus_dir", "load_corpus"]
