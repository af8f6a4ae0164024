"""Dropout with a cheaper random mask on CPU.

torch's CPU dropout draws one Bernoulli sample per element through the Mersenne
Twister, which is slow per element and a visible share of a training step for the
three dropouts of a batch (source and target embeddings, output layer input;
docs/performance.md#dropout-masks). This
draws 64 random bits at a time and splits them into four 16-bit uniform integers,
so an element is dropped when its integer falls below ``round(p * 65536)``: the
dropout probability is realised to a multiple of 1/65536 (0.2 -> 0.199997) and the
kept elements are scaled by the exact inverse of the realised keep probability, so
the expectation is unchanged. Seeding works as usual (torch's generator). Other
devices, and probabilities a 16-bit threshold cannot express, use ``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16  # values of one 16-bit lane


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of x with probability p (to 1/65536), scale the rest; x if not training."""
    if not training or p == 0.0:
        return x
    drop = round(p * _LEVELS)
    if x.device.type != "cpu" or not 0 < drop < _LEVELS:
        return F.dropout(x, p, training)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device)
    bits.random_(-(1 << 63), (1 << 63) - 1)  # 64 uniform bits per element
    lanes = bits.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    mask = (lanes >= drop - _LEVELS // 2).to(x.dtype).mul_(_LEVELS / (_LEVELS - drop))
    return x * mask


class Dropout(nn.Module):
    """nn.Dropout with the mask of :func:`dropout`."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
