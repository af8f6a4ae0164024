"""The optimizer and the learning-rate schedules of ``train.lr_schedule``."""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig


def build_optimizer(model: torch.nn.Module, t: DictConfig) -> tuple[torch.optim.Optimizer, Any]:
    """Adam plus the schedule of ``train.lr_schedule``.

    plateau: multiply by ``lr_decay`` when dev loss has not improved for
    ``lr_patience`` validations (stepped in :func:`validate`); constant and
    inverse_sqrt: a per-step LambdaLR with linear warm-up over ``warmup_steps``.
    """
    optimizer = _adam(list(model.parameters()), t.lr)
    if t.lr_schedule == "plateau":
        return optimizer, torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=t.lr_decay, patience=t.lr_patience, min_lr=t.min_lr)
    warmup, floor = t.warmup_steps, min(1.0, t.min_lr / t.lr)
    inverse_sqrt = t.lr_schedule == "inverse_sqrt"

    def factor(step: int) -> float:
        s = step + 1
        if warmup and s < warmup:
            return s / warmup
        if not inverse_sqrt:
            return 1.0
        return max(floor, math.sqrt(max(warmup, 1) / s))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _adam(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam with torch's fused kernel where it exists (CPU since torch 2.4, CUDA): one
    pass over each parameter instead of a dozen, so the update step costs far less
    (docs/performance.md#fused-adam); the same update rule and state, so checkpoints
    resume either way."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # an older torch, or a device without the kernel
        return torch.optim.Adam(params, lr=lr)
