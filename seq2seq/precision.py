"""Which precision training and decoding run in (``train.precision``, ``precision`` of
`seq2seq-translate`): auto | fp32 | bf16, chosen by measuring.

bf16 autocast runs the matmuls (RNN input and gate projections, attention, the output
layer and loss GEMMs) in bf16 with fp32 accumulation; parameters, gradients, the
optimizer and the softmax/loss stay fp32. Whether that is faster depends on the machine
far more than on its feature flags: a CPU with native bf16 matmuls can still lose the
gain in casts and small per-step matmuls, and one without them emulates bf16 far slower
than fp32 (docs/performance.md#bf16-autocast-trainprecisionauto). So ``auto`` times a
few real passes of the model in each precision (training: forward+backward on a real
batch; decoding: decoder steps at the batch size the command decodes with), alternating,
and keeps bf16 only when it is clearly faster (:data:`MIN_SPEEDUP`). The probe changes
nothing: no optimizer step, the gradients are cleared and every RNG state is restored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from seq2seq import runtime
from seq2seq.config import Precision
from seq2seq.errors import ConfigError

CHOICES = tuple(Precision)  # the schema's choices; check() is for library callers
MIN_SPEEDUP = 1.15  # bf16 must save at least this factor of step time to be chosen
PROBE_ROUNDS = 3  # timed passes per precision, after one untimed warm-up pass each


@dataclass
class Choice:
    """The precision a run trains in, and why."""

    bf16: bool
    reason: str


def check(name: str, key: str = "train.precision") -> None:
    if name not in CHOICES:
        raise ConfigError(f"{key}={name!r}: use auto, fp32 or bf16")


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Seconds ``step()`` takes on ``device`` (a GPU is synchronized before the clock stops)."""
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def probe(step: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """(fp32, bf16) median seconds of ``step()`` (one forward+backward), measured alternately."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for bf16 in (False, True):  # warm-up: first calls allocate and pick kernels
        with runtime.autocast(device, bf16):
            timed(step, device)
    for _ in range(PROBE_ROUNDS):
        for bf16 in (False, True):
            with runtime.autocast(device, bf16):
                times[bf16].append(timed(step, device))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return med[False], med[True]


def choose(name: str, device: torch.device, step: Callable[[], None],
           key: str = "train.precision", what: str = "a training pass") -> Choice:
    """Resolve setting ``key`` = ``name`` on ``device``; ``step`` runs ``what`` once (one
    forward+backward pass, or a few decoder steps; only called for ``auto`` where bf16
    is native)."""
    check(name, key)
    if name == "fp32":
        return Choice(False, f"{key}=fp32")
    if not runtime.bf16_supported(device):
        why = f"{device} has no native bf16 (emulated bf16 is far slower than fp32)"
        return Choice(False, f"fp32: {why}" if name == "auto" else f"fp32, {key}=bf16 "
                      f"ignored: {why}")
    if name == "bf16":
        return Choice(True, f"{key}=bf16")
    with _rng_kept(device):
        fp32_s, bf16_s = probe(step, device)
    speedup = fp32_s / bf16_s if bf16_s > 0 else 0.0
    bf16 = speedup >= MIN_SPEEDUP
    return Choice(bf16, f"{'bf16' if bf16 else 'fp32'} (auto: {what} took "
                        f"{fp32_s * 1e3:.0f} ms in fp32, {bf16_s * 1e3:.0f} ms in bf16, "
                        f"x{speedup:.2f}; bf16 needs x{MIN_SPEEDUP})")


@contextlib.contextmanager
def _rng_kept(device: torch.device):
    """Every RNG the probe's dropout draws from is restored afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield
