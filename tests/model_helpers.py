"""Shared pieces of the model, attention and search tests (imported, not collected)."""

from __future__ import annotations

import pytest
import torch

from seq2seq.config import AttentionConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.model.attention import LUONG_SCORES

# every attention, and Luong with every score, with and without input feeding
ATTENTION_VARIANTS = [AttentionConfig(name="none"), AttentionConfig(name="bahdanau")] + [
    AttentionConfig(name="luong", score=score, input_feeding=feeding)
    for score in LUONG_SCORES for feeding in (True, False)
] + [AttentionConfig(name="luong", score="general", input_feeding=True, deep_output=True)]


def variant_id(cfg: AttentionConfig) -> str:
    """A readable pytest id for an attention config."""
    if cfg.name != "luong":
        return cfg.name
    deep = "-deep" if cfg.deep_output else ""
    return f"luong-{cfg.score}-{'feed' if cfg.input_feeding else 'nofeed'}{deep}"


@pytest.fixture(autouse=True)
def one_thread():
    # tiny models: one thread is faster and immune to other processes on the cores
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reverse_task(n: int = 32, vocab: int = 12, seed: int = 0):
    """Random sequences of 3-7 symbols (ids 4..vocab-1); target = the sequence reversed + EOS.

    Returns src (n, 7), src_lens (n,), tgt_in (n, 8), tgt_out (n, 8).
    """
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 8, (n,), generator=gen)
    src = torch.full((n, 7), PAD_ID)
    tgt = torch.full((n, 9), PAD_ID)
    for i, length in enumerate(lens.tolist()):
        seq = torch.randint(4, vocab, (length,), generator=gen)
        src[i, :length] = seq
        tgt[i, 0] = BOS_ID
        tgt[i, 1:length + 1] = seq.flip(0)
        tgt[i, length + 1] = EOS_ID
    return src, lens, tgt[:, :-1], tgt[:, 1:]


def fit(model: torch.nn.Module, src, lens, tgt_in, tgt_out, steps: int) -> torch.Tensor:
    """Full-batch Adam (lr 1e-2) on one batch for ``steps`` steps; returns the last loss."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(
            model(src, lens, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss
