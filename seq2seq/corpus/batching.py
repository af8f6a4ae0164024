"""Token-based batches bucketed by length.

A split is encoded once into flat id arrays (cached as ``.npz`` so a restart does
not re-tokenize), then cut into batches of about ``batch_tokens`` target tokens
(padding excluded). Training batches sort pairs by length inside large shuffled
pools, so padding stays small, and then shuffle the batches. The order depends
only on ``(seed, epoch)``: a resumed run rebuilds the same epoch and skips the
batches it already trained on.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from seq2seq.atomic import atomic_open
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError, DataError

# Pairs sorted together: this many batches' worth. Larger pools pad less but
# make batches of similar lengths follow each other more often.
POOL_BATCHES = 100


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class _Tokenizers(Protocol):
    src: _Encoder
    tgt: _Encoder


@dataclass
class EncodedSplit:
    """Token ids of one split, stored flat (no BOS/EOS).

    Pair ``i`` has source ids ``src_ids[src_off[i]:src_off[i+1]]`` and target
    ids ``tgt_ids[tgt_off[i]:tgt_off[i+1]]``; ``src_words[i]`` is its source
    length in whitespace words (the unit of ``train.max_src_words``).
    """

    src_ids: np.ndarray  # (total_src_tokens,) int32
    src_off: np.ndarray  # (n + 1,) int64
    tgt_ids: np.ndarray  # (total_tgt_tokens,) int32
    tgt_off: np.ndarray  # (n + 1,) int64
    src_words: np.ndarray  # (n,) int32

    def __len__(self) -> int:
        return len(self.src_words)

    @property
    def src_lens(self) -> np.ndarray:
        """(n,) source lengths in subword tokens."""
        return np.diff(self.src_off)

    @property
    def tgt_lens(self) -> np.ndarray:
        """(n,) target lengths in subword tokens, without BOS/EOS."""
        return np.diff(self.tgt_off)

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_off[i] : self.src_off[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_off[i] : self.tgt_off[i + 1]]


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    off = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(off[-1]))
    return flat, off


def encode_pairs(
    pairs: Iterable[dict[str, str]], tokenizers: _Tokenizers, src_lang: str, tgt_lang: str
) -> EncodedSplit:
    """Encode ``translation`` dicts (``{src_lang: text, tgt_lang: text}``) into an EncodedSplit."""
    src_seqs, tgt_seqs, words = [], [], []
    for pair in pairs:
        src_text, tgt_text = pair[src_lang], pair[tgt_lang]
        src_seqs.append(tokenizers.src.encode(src_text))
        tgt_seqs.append(tokenizers.tgt.encode(tgt_text))
        words.append(len(src_text.split()))
    src_ids, src_off = _flatten(src_seqs)
    tgt_ids, tgt_off = _flatten(tgt_seqs)
    return EncodedSplit(src_ids, src_off, tgt_ids, tgt_off, np.asarray(words, dtype=np.int32))


def cache_key(*parts: Any) -> str:
    """A short stable hash of the things an encoding depends on (corpus, tokenizer)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def tokenizer_fingerprint(tokenizers: Any) -> str:
    """Hash of the tokenizer models' bytes, via the public ``Tokenizers.save``.

    Two runs that tokenize identically share an encoding cache; a retrained
    tokenizer gets a new one.
    """
    with tempfile.TemporaryDirectory() as tmp:
        tokenizers.save(tmp)
        files = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
        return cache_key(*(part for p in files for part in (str(p.relative_to(tmp)), p.read_bytes())))


def load_or_encode(
    dataset: Any,
    tokenizers: _Tokenizers,
    src_lang: str,
    tgt_lang: str,
    cache_file: Path | None = None,
) -> EncodedSplit:
    """Encode a ``datasets.Dataset`` split, reusing ``cache_file`` (.npz) when it exists.

    The caller puts the corpus and tokenizer fingerprints in the file name (see
    :func:`cache_key`), so a stale cache is never read. The file is written
    atomically, so an interrupted run cannot leave half a cache behind.
    """
    if cache_file is not None and cache_file.exists():
        try:
            with np.load(cache_file) as z:
                return EncodedSplit(**{k: z[k] for k in z.files})
        except Exception:  # a damaged or foreign cache file is rebuilt, it holds nothing else
            pass
    enc = encode_pairs(dataset["translation"], tokenizers, src_lang, tgt_lang)
    if cache_file is not None:
        with atomic_open(cache_file, "wb") as fh:
            np.savez(fh, **enc.__dict__)
    return enc


def length_filter(enc: EncodedSplit, max_src_words: int) -> tuple[np.ndarray, int]:
    """Indices of pairs with at most ``max_src_words`` source words, and how many were dropped.

    Pairs with an empty side are dropped too: they carry no training signal and
    an empty source cannot be packed.
    """
    keep = (enc.src_words <= max_src_words) & (enc.src_lens > 0) & (enc.tgt_lens > 0)
    kept = np.flatnonzero(keep)
    return kept, len(enc) - len(kept)


def _cut(order: np.ndarray, cost: np.ndarray, batch_tokens: int) -> list[np.ndarray]:
    """Cut ``order`` into consecutive batches whose summed ``cost`` stays within the budget.

    A pair that alone exceeds the budget gets a batch of its own.
    """
    batches, start, total = [], 0, 0
    for pos, idx in enumerate(order):
        c = int(cost[idx])
        if pos > start and total + c > batch_tokens:
            batches.append(order[start:pos])
            start, total = pos, 0
        total += c
    if start < len(order):
        batches.append(order[start:])
    return batches


def train_batches(
    enc: EncodedSplit, indices: np.ndarray, batch_tokens: int, seed: int, epoch: int
) -> list[np.ndarray]:
    """The batches of one training epoch, a pure function of ``(seed, epoch)``.

    Each batch holds pair indices whose target tokens (``len(y) + 1``: the EOS,
    or the BOS of ``tgt_in``) sum to at most ``batch_tokens``.
    """
    rng = np.random.default_rng([seed, epoch])
    cost = enc.tgt_lens + 1
    src_lens = enc.src_lens
    shuffled = rng.permutation(indices)
    mean_cost = float(cost[indices].mean()) if len(indices) else 1.0
    pool_size = max(1, int(POOL_BATCHES * batch_tokens / mean_cost))
    batches: list[np.ndarray] = []
    for start in range(0, len(shuffled), pool_size):
        pool = shuffled[start : start + pool_size]
        # stable sort by (source, target) length so equal lengths keep the shuffled order
        pool = pool[np.lexsort((cost[pool], src_lens[pool]))]
        batches.extend(_cut(pool, cost, batch_tokens))
    return [batches[i] for i in rng.permutation(len(batches))]


def eval_batches(enc: EncodedSplit, indices: np.ndarray, batch_tokens: int) -> list[np.ndarray]:
    """Length-sorted batches for loss evaluation or decoding, in a fixed order.

    Each batch records the pair indices, so results can be put back in corpus order.
    """
    indices = np.asarray(indices)
    order = indices[np.lexsort((enc.tgt_lens[indices], enc.src_lens[indices]))]
    return _cut(order, enc.tgt_lens + 1, batch_tokens)


@dataclass
class Batch:
    """Padded tensors of one batch, rows sorted by target length (longest first; ties
    by source length), so the decoder's step loop can drop finished rows off the end.

    src: (batch, src_len) long, PAD_ID after each source
    src_lens: (batch,) long
    tgt_in: (batch, tgt_len + 1) long, BOS + y, then PAD_ID
    tgt_out: (batch, tgt_len + 1) long, y + EOS, then PAD_ID
    ids: (batch,) long, the pair index of each row in the split
    n_src_tokens, n_tgt_tokens: real tokens (target counts the EOS), kept as
    Python ints so reading them never waits for a GPU.
    """

    src: torch.Tensor
    src_lens: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    ids: torch.Tensor
    n_src_tokens: int
    n_tgt_tokens: int

    @property
    def src_mask(self) -> torch.Tensor:
        """(batch, src_len) bool, True on real tokens."""
        return self.src != PAD_ID

    @property
    def tgt_mask(self) -> torch.Tensor:
        """(batch, tgt_len + 1) bool, True where ``tgt_out`` is a real token (incl. EOS)."""
        return self.tgt_out != PAD_ID

    def _map(self, fn: Any) -> Batch:
        return Batch(**{k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """Page-locked copies, so ``to(cuda, non_blocking=True)`` overlaps with compute."""
        return self._map(lambda t: t.pin_memory())


def collate(enc: EncodedSplit, idx: np.ndarray) -> Batch:
    """Pad the pairs ``idx`` of ``enc`` into a :class:`Batch`."""
    idx = np.asarray(idx)
    idx = idx[np.lexsort((-enc.src_lens[idx], -enc.tgt_lens[idx]))]
    src_lens = enc.src_lens[idx]
    tgt_lens = enc.tgt_lens[idx]
    n = len(idx)
    src = np.full((n, max(int(src_lens.max()), 1)), PAD_ID, dtype=np.int64)
    tgt_in = np.full((n, int(tgt_lens.max()) + 1), PAD_ID, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD_ID)
    for row, i in enumerate(idx):
        s, t = enc.src(i), enc.tgt(i)
        src[row, : len(s)] = s
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    return Batch(
        src=torch.from_numpy(src),
        src_lens=torch.from_numpy(src_lens.astype(np.int64)),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        ids=torch.from_numpy(idx.astype(np.int64)),
        n_src_tokens=int(src_lens.sum()),
        n_tgt_tokens=int(tgt_lens.sum()) + n,
    )


@dataclass
class TrainingData:
    """The encoded train and valid splits, with the pairs the loop may use."""

    train: EncodedSplit
    train_idx: np.ndarray  # (n_kept,) pairs within the length limit
    dropped: int  # training pairs dropped by the length limit (or empty)
    valid: EncodedSplit
    valid_idx: np.ndarray  # (n_valid,) dev pairs with both sides non-empty
    valid_refs: list[str]  # dev target text as in the corpus, the references of dev BLEU


def training_data(
    corpus: Any, tokenizers: Any, src_lang: str, tgt_lang: str, max_src_words: int,
    cache_dir: Path | None = None,
) -> TrainingData:
    """Encode ``corpus['train']`` and ``corpus['valid']`` (cached) and apply the length limit.

    ``corpus`` is the DatasetDict of :func:`seq2seq.corpus.load_corpus`. The cache
    file name covers the split's datasets fingerprint and the tokenizer models.
    """
    tok_key = tokenizer_fingerprint(tokenizers)
    splits = {}
    for name in ("train", "valid"):
        if name not in corpus:
            raise DataError(f"the corpus has no {name!r} split: rebuild it with seq2seq-data")
        key = cache_key(getattr(corpus[name], "_fingerprint", None), len(corpus[name]), tok_key,
                        src_lang, tgt_lang)
        cache = cache_dir / f"{name}-{key}.npz" if cache_dir is not None else None
        splits[name] = load_or_encode(corpus[name], tokenizers, src_lang, tgt_lang, cache)
    train_idx, dropped = length_filter(splits["train"], max_src_words)
    if len(train_idx) == 0:
        raise ConfigError(f"no training pair has at most train.max_src_words={max_src_words} "
                          "source words: raise train.max_src_words")
    valid_idx, _ = length_filter(splits["valid"], np.iinfo(np.int32).max)
    if len(valid_idx) == 0:
        raise DataError("the corpus's valid split is empty: give dev more pairs (data.valid_size, "
                        "data.valid_per_bucket, or data.valid_file for data=local) and rebuild "
                        "it with seq2seq-data")
    refs = [pair[tgt_lang] for pair in corpus["valid"]["translation"]]
    return TrainingData(splits["train"], train_idx, dropped, splits["valid"], valid_idx, refs)
