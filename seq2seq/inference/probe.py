"""A decoding batch to time: what :mod:`seq2seq.precision` and
:func:`seq2seq.inference.workers.choose_workers` measure before choosing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.constants import BOS_ID, UNK_ID
from seq2seq.inference.search import no_grad_mode

PROBE_SRC_LEN = 30  # source subwords of the probes' sentences (a typical verse)


def step_probe(model: nn.Module, sentences: int, beam: int, src_len: int = PROBE_SRC_LEN,
               steps: int = 8) -> Callable[[], None]:
    """A function that encodes a synthetic batch of ``sentences`` sources of ``src_len``
    tokens and runs ``steps`` decoder steps on its ``sentences * beam`` rows: what one
    batch of this size costs, for timing a precision (seq2seq.precision.choose)."""
    batch: dict[str, Tensor] = {}  # made at the first call: building it costs nothing unused

    def run() -> None:
        if not batch:
            device = next(model.parameters()).device
            # the cost does not depend on which ids are read: UNK exists in every vocabulary
            batch["src"] = torch.full((sentences, src_len), UNK_ID, dtype=torch.long, device=device)
            batch["lens"] = torch.full((sentences,), src_len, dtype=torch.long, device=device)
        with no_grad_mode(batch["src"].device.type):
            memory = model.encode(batch["src"], batch["lens"]).repeat_rows(beam)
            state = model.init_state(memory)
            y = torch.full((sentences * beam,), BOS_ID, dtype=torch.long,
                           device=batch["src"].device)
            for _ in range(steps):
                logits, state, _ = model.step(y, state, memory)
                y = logits.argmax(dim=-1).clamp_min(4)

    return run
