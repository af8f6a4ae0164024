"""Where and how a job runs: device choice, torch threads, seeding."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from seq2seq.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda[:N]`` -> a device; CUDA asked for but absent is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is visible: use train.device=auto or cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (every device) from one number."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def set_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = every core this process may use); returns the count."""
    n = threads if threads > 0 else len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    return n
