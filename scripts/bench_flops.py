"""FLOPs of a training step for scripts/benchmark.py (FLOPs per target token and the
fraction of the matmul rate reached)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import flop_counter as fc

from seq2seq.corpus import batching
from seq2seq.training.loop import Run, autocast


def flop_counter() -> fc.FlopCounterMode:
    """torch's FlopCounterMode, also counting the in-place products ``addmm_`` and
    ``baddbmm_``: it has no formula for them and counts them as 0, and the fp32 fused loss
    sums grad W with ``addmm_`` (a third of the loss's products)."""
    # FlopCounterMode hands these the inputs' shapes; the registered formulas they call
    # accept shapes too (their wrapper passes a shape through unchanged)
    def addmm_(self_shape: Any, a_shape: Any, b_shape: Any, **_: Any) -> int:
        return fc.addmm_flop(self_shape, a_shape, b_shape)

    def baddbmm_(self_shape: Any, a_shape: Any, b_shape: Any, **_: Any) -> int:
        return fc.baddbmm_flop(self_shape, a_shape, b_shape)

    aten = torch.ops.aten
    return fc.FlopCounterMode(display=False, custom_mapping={
        aten.addmm_: addmm_, aten.addmm_.default: addmm_,
        aten.baddbmm_: baddbmm_, aten.baddbmm_.default: baddbmm_})


def count_flops(run: Run, batch: batching.Batch) -> dict[str, float]:
    """FLOPs of one forward + loss + backward (:func:`flop_counter`: matmuls, incl. the
    GRUs' gate matmuls) and per real target token (padded positions cost FLOPs in the
    recurrence; the output layer and loss skip them)."""
    with flop_counter() as counter:
        with autocast(run):
            loss = run.model(batch.src, batch.src_lens, batch.tgt_in, targets=batch.tgt_out)
        (loss / batch.n_tgt_tokens).backward()
    run.model.zero_grad(set_to_none=True)
    total = counter.get_total_flops()
    return {"flops_fwd_bwd": float(total), "flops_per_tgt_token": total / batch.n_tgt_tokens}
