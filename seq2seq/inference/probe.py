"""Decoding batches to time: what :mod:`seq2seq.precision` and
:func:`seq2seq.inference.workers.choose_workers` measure before choosing.

:func:`step_probe` times the model's steps alone (what a precision changes);
:func:`search_probe` times the whole search, whose own per-step work (top-k, reordering,
bookkeeping in Python) is what batches decoded side by side overlap with the model's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.constants import BOS_ID, UNK_ID
from seq2seq.inference.search import SearchSettings, no_grad_mode, search_batch

PROBE_SRC_LEN = 30  # source subwords of the probes' sentences (a typical verse)


def _lazy_batch(model: nn.Module, sentences: int, src_len: int
                ) -> Callable[[], tuple[Tensor, Tensor]]:
    """A function returning a synthetic batch, src (sentences, src_len) and src_lens
    (sentences,), made at its first call (building it costs nothing unused; the first call
    is not thread-safe). The cost does not depend on which ids are read: UNK exists in
    every vocabulary."""
    batch: list[Tensor] = []

    def get() -> tuple[Tensor, Tensor]:
        if not batch:
            device = next(model.parameters()).device
            batch.append(torch.full((sentences, src_len), UNK_ID, dtype=torch.long, device=device))
            batch.append(torch.full((sentences,), src_len, dtype=torch.long, device=device))
        return batch[0], batch[1]

    return get


def step_probe(model: nn.Module, sentences: int, beam: int, src_len: int = PROBE_SRC_LEN,
               steps: int = 8) -> Callable[[], None]:
    """A function that encodes a synthetic batch of ``sentences`` sources of ``src_len``
    tokens and runs ``steps`` decoder steps on its ``sentences * beam`` rows: what one
    batch of this size costs, for timing a precision (seq2seq.precision.choose)."""
    batch = _lazy_batch(model, sentences, src_len)

    def run() -> None:
        src, lens = batch()
        with no_grad_mode(src.device.type):
            memory = model.encode(src, lens).repeat_rows(beam)
            state = model.init_state(memory)
            y = torch.full((sentences * beam,), BOS_ID, dtype=torch.long, device=src.device)
            for _ in range(steps):
                logits, state, _ = model.step(y, state, memory)
                y = logits.argmax(dim=-1).clamp_min(4)

    return run


def search_probe(model: nn.Module, sentences: int, beam: int, src_len: int = PROBE_SRC_LEN,
                 steps: int = 8) -> Callable[[], None]:
    """A function that decodes a synthetic batch of ``sentences`` sources of ``src_len``
    tokens through the real search (greedy for ``beam`` 1, else beam search), each output
    capped at ``steps`` tokens: what one batch of this size costs a worker, search included
    (seq2seq.inference.workers.choose_workers)."""
    batch = _lazy_batch(model, sentences, src_len)
    cap = SearchSettings(max_len_ratio=0.0, max_len_extra=steps)  # outputs of <= steps tokens

    def run() -> None:
        search_batch(model, *batch(), beam, 1, cap)

    return run
