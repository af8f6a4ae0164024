"""Token-based batching: budget, coverage, determinism, padding and the encoding cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.corpus import batching


class CharTokenizer:
    """One id per character: enough to exercise batching without SentencePiece."""

    vocab_size = 64

    def encode(self, text: str) -> list[int]:
        return [4 + ord(c) % 60 for c in text if c != " "]


class Pair:
    src = CharTokenizer()
    tgt = CharTokenizer()


class ExplodingTokenizers:
    """Proves a cached split is read without tokenizing again."""

    class _Side:
        def encode(self, text: str) -> list[int]:
            raise AssertionError("the cache should have been used")

    src = tgt = _Side()


def make_pairs(n: int = 600, seed: int = 0) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        words = int(rng.integers(1, 60))
        src = " ".join("ab"[: 1 + int(rng.integers(0, 2))] for _ in range(words))
        tgt = " ".join("xyz"[: 1 + int(rng.integers(0, 3))] for _ in range(words + int(rng.integers(0, 4))))
        pairs.append({"es": src, "en": tgt})
    return pairs


@pytest.fixture(scope="module")
def enc() -> batching.EncodedSplit:
    return batching.encode_pairs(make_pairs(), Pair(), "es", "en")


def test_encode_pairs_offsets_and_words(enc: batching.EncodedSplit) -> None:
    pairs = make_pairs()
    assert len(enc) == len(pairs)
    for i in (0, 17, len(pairs) - 1):
        assert enc.src(i).tolist() == CharTokenizer().encode(pairs[i]["es"])
        assert enc.tgt(i).tolist() == CharTokenizer().encode(pairs[i]["en"])
        assert enc.src_words[i] == len(pairs[i]["es"].split())


@pytest.mark.parametrize("budget", [50, 300, 2000])
def test_batches_respect_the_token_budget(enc: batching.EncodedSplit, budget: int) -> None:
    idx, _ = batching.length_filter(enc, 1000)
    cost = enc.tgt_lens + 1
    for b in batching.train_batches(enc, idx, budget, seed=1, epoch=0):
        assert cost[b].sum() <= budget or len(b) == 1
    for b in batching.eval_batches(enc, idx, budget):
        assert cost[b].sum() <= budget or len(b) == 1


def test_budget_is_mostly_filled(enc: batching.EncodedSplit) -> None:
    idx, _ = batching.length_filter(enc, 1000)
    batches = batching.train_batches(enc, idx, 2000, seed=1, epoch=0)
    fill = (enc.tgt_lens + 1)[np.concatenate(batches)].sum() / (2000 * len(batches))
    assert fill > 0.85


def test_every_pair_once_per_epoch(enc: batching.EncodedSplit) -> None:
    idx, _ = batching.length_filter(enc, 40)
    for epoch in range(3):
        seen = np.concatenate(batching.train_batches(enc, idx, 500, seed=3, epoch=epoch))
        assert sorted(seen.tolist()) == sorted(idx.tolist())
    seen = np.concatenate(batching.eval_batches(enc, idx, 500))
    assert sorted(seen.tolist()) == sorted(idx.tolist())


def test_order_is_a_function_of_seed_and_epoch(enc: batching.EncodedSplit) -> None:
    idx, _ = batching.length_filter(enc, 1000)

    def order(seed: int, epoch: int) -> list[list[int]]:
        return [b.tolist() for b in batching.train_batches(enc, idx, 500, seed, epoch)]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)


def test_bucketing_keeps_padding_small(enc: batching.EncodedSplit) -> None:
    idx, _ = batching.length_filter(enc, 1000)
    real = padded = 0
    for b in batching.train_batches(enc, idx, 1000, seed=1, epoch=0):
        batch = batching.collate(enc, b)
        real += int(batch.src_mask.sum())
        padded += batch.src.numel()
    assert real / padded > 0.9  # random batches of these lengths are ~45% padding


def test_length_filter_counts_drops(enc: batching.EncodedSplit) -> None:
    idx, dropped = batching.length_filter(enc, 30)
    assert dropped == int((enc.src_words > 30).sum())
    assert len(idx) + dropped == len(enc)
    assert enc.src_words[idx].max() <= 30


def test_collate_pads_and_shifts(enc: batching.EncodedSplit) -> None:
    idx = np.array([5, 1, 300, 42])
    batch = batching.collate(enc, idx)
    lens = batch.src_lens.tolist()
    tgt_lens = batch.tgt_mask.sum(1).tolist()
    # longest target first (the decoder drops finished rows off the end), ties by source
    assert tgt_lens == sorted(tgt_lens, reverse=True)
    assert [(t, s) for t, s in zip(tgt_lens, lens, strict=True)] == sorted(
        zip(tgt_lens, lens, strict=True), reverse=True)
    assert sorted(batch.ids.tolist()) == sorted(idx.tolist())
    assert batch.src_mask.sum(1).tolist() == lens
    for row, i in enumerate(batch.ids.tolist()):
        s, t = enc.src(i).tolist(), enc.tgt(i).tolist()
        assert batch.src[row, : len(s)].tolist() == s
        assert (batch.src[row, len(s):] == PAD_ID).all()
        assert batch.tgt_in[row, : len(t) + 1].tolist() == [BOS_ID, *t]
        assert batch.tgt_out[row, : len(t) + 1].tolist() == [*t, EOS_ID]
        assert (batch.tgt_in[row, len(t) + 1:] == PAD_ID).all()
        assert (batch.tgt_out[row, len(t) + 1:] == PAD_ID).all()
    assert batch.n_tgt_tokens == sum(len(enc.tgt(i)) + 1 for i in idx)
    assert batch.tgt_mask.sum().item() == batch.n_tgt_tokens
    assert batch.src_mask.sum().item() == batch.n_src_tokens == sum(len(enc.src(i)) for i in idx)
    assert batch.src.dtype == torch.long and batch.tgt_in.shape == batch.tgt_out.shape


def test_cache_is_written_and_reused(tmp_path) -> None:
    pairs = make_pairs(50)
    dataset = {"translation": pairs}
    cache = tmp_path / "cache" / "train-abc.npz"
    first = batching.load_or_encode(dataset, Pair(), "es", "en", cache)
    assert cache.is_file()
    again = batching.load_or_encode(dataset, ExplodingTokenizers(), "es", "en", cache)
    for name in ("src_ids", "src_off", "tgt_ids", "tgt_off", "src_words"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    assert [p.name for p in cache.parent.iterdir()] == ["train-abc.npz"]  # no temp file left


def test_damaged_cache_is_rebuilt(tmp_path) -> None:
    dataset = {"translation": make_pairs(20)}
    cache = tmp_path / "train-abc.npz"
    cache.write_bytes(b"PK\x03\x04 truncated")
    enc = batching.load_or_encode(dataset, Pair(), "es", "en", cache)
    assert len(enc) == 20
    assert len(batching.load_or_encode(dataset, ExplodingTokenizers(), "es", "en", cache)) == 20


def test_cache_key_changes_with_its_parts() -> None:
    assert batching.cache_key("a", 1) == batching.cache_key("a", 1)
    assert batching.cache_key("a", 1) != batching.cache_key("a", 2)
    assert batching.cache_key(b"model-bytes") != batching.cache_key(b"model-bytez")
