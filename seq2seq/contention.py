"""Whether other processes take the cores torch's threads run on, read from this process's
own CPU time.

torch's intra-op threads (libgomp's OpenMP team) spin while they wait for each other, so
a process alone on its cores is charged about ``threads`` CPU seconds per wall second,
even in the step loop's short gaps between operations. When another process takes one of
those cores, every parallel region (thousands per training step) waits until the
descheduled thread runs again, and training runs many times slower, slower even than on
one thread (docs/performance.md#busy-cores). The process is then charged much less than
``threads`` CPU seconds per wall second; that share is what is measured here. It may
also fall when a virtual machine's host takes the core (steal time; not measured). It
does not see contention that leaves the process its cores, such as memory bandwidth
taken by another process.

Users: ``train.precision=auto``'s probe (seq2seq.precision) redoes a round timed on busy
cores, and training warns when a log window ran on busy cores (seq2seq.training.loop).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field

import torch

BUSY_BELOW = 0.8  # a share of the threads' CPU time under this reads as busy cores
MIN_WALL = 0.05  # seconds: shorter spans are not judged (CPU time is charged in ticks)
# libgomp's settings under which waiting threads sleep instead of spinning: the share then
# falls in every gap between operations and says nothing about other processes
_SLEEPING = (("OMP_WAIT_POLICY", "passive"), ("GOMP_SPINCOUNT", "0"))
ADVICE = ("another process is using these cores, and torch's threads, which wait for each "
          "other, then run several times slower; free the cores, or set fewer threads "
          "(train.threads=1) (docs/performance.md#busy-cores)")


def cpu_seconds() -> float:
    """User and system CPU seconds this process (every thread) has been charged."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measurable(device: torch.device) -> bool:
    """Whether the share says anything: CPU work, with waiting threads that spin."""
    if device.type != "cpu":  # a GPU run's host thread waits on the device
        return False
    return not any(os.environ.get(k, "").strip().lower() == v for k, v in _SLEEPING)


@dataclass
class Meter:
    """CPU and wall seconds summed over the spans between :meth:`start` and :meth:`stop`."""

    cpu: float = 0.0
    wall: float = 0.0
    _started: tuple[float, float] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._started = (cpu_seconds(), time.perf_counter())

    def stop(self) -> None:
        if self._started is None:
            raise RuntimeError("Meter.stop() without start()")
        cpu, wall = self._started
        self.cpu += cpu_seconds() - cpu
        self.wall += time.perf_counter() - wall
        self._started = None

    def share(self, threads: int | None = None) -> float:
        """CPU seconds per wall second per thread (~1.0 alone on the cores; 1.0 when
        nothing was measured)."""
        threads = threads or torch.get_num_threads()
        return self.cpu / (self.wall * threads) if self.wall > 0 else 1.0

    def busy(self, threads: int | None = None) -> bool:
        """Whether the spans ran on cores other processes took (:data:`BUSY_BELOW`; spans
        under :data:`MIN_WALL` in all are not judged)."""
        return self.wall >= MIN_WALL and self.share(threads) < BUSY_BELOW


def describe(share: float, threads: int | None = None) -> str:
    """``share`` in words, e.g. "the process got 52% of its 2 threads' CPU time"."""
    threads = threads or torch.get_num_threads()
    return f"the process got {share:.0%} of its {threads} threads' CPU time"
