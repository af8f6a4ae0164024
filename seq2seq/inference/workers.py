"""Decoding batches side by side: one torch thread per batch, and how many at once.

A beam search step is a chain of small matrix products and elementwise ops over a few
hundred rows. Splitting each op across cores (torch's intra-op threads) pays little for
such small work, while whole batches decoded side by side, each on one thread, can keep
every core busy. Which is faster depends on the machine, so ``workers=-1`` (auto) times
both at start-up (:func:`choose_workers`) instead of assuming.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from seq2seq.precision import timed

# batches side by side must be at least this much faster to be chosen. The probe reads
# less than whole files gain, so x1.1 kept 1 worker too often (docs/performance.md#decoding)
MIN_SPEEDUP = 1.05
PROBE_ROUNDS = 3  # timed rounds of each layout, alternating, after one untimed warm-up


def in_workers(job: Callable[[Any], Any], items: Sequence[Any], workers: int,
               device_type: str = "cpu") -> Iterator[Any]:
    """``job(item)`` for every item, ``workers`` at a time in threads, results in item order.

    Each worker runs on one torch thread: torch's thread count is 1 until the last result
    is taken, then restored. torch releases the GIL inside its ops, so the threads compute
    in parallel. Autocast is thread-local: the workers run under the caller's. At most
    2 x ``workers`` results wait to be taken, so memory stays bounded.
    """
    enabled = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type)

    def run(item: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            return job(item)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="decode") as pool:
            pending: deque[Future] = deque()
            for item in items:
                pending.append(pool.submit(run, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
    finally:
        torch.set_num_threads(threads)


def choose_workers(workers: int, model: nn.Module, batch_tokens: int, beam: int
                   ) -> tuple[int, str]:
    """Resolve ``workers`` (-1 = auto) for batches of ``batch_tokens`` source subwords at
    ``beam``; returns the number and why.

    Auto, on a CPU with T > 1 torch threads: T batches side by side on one thread each,
    when timing the first steps of T batches' searches that way beats the same T batches
    one after another on all T threads by :data:`MIN_SPEEDUP`; else one batch at a time.
    Elsewhere (a GPU, one thread) 1. The search's own per-step work is timed with the
    model's: side by side, one batch's search runs while the other's matmuls do
    (docs/performance.md#decoding).
    """
    from seq2seq.inference.probe import PROBE_SRC_LEN, search_probe

    if workers > 0:
        return workers, f"workers={workers}"
    threads = torch.get_num_threads()
    device = next(model.parameters()).device
    if device.type != "cpu" or threads < 2:
        return 1, f"1 (auto: {'one thread' if device.type == 'cpu' else device.type})"
    sentences = max(1, batch_tokens // PROBE_SRC_LEN)
    probe = search_probe(model, sentences, beam, PROBE_SRC_LEN)
    probe()  # builds the probe's batch (not thread-safe) and warms the kernels

    def side_by_side() -> None:
        for _ in in_workers(lambda _: probe(), range(threads), threads, device.type):
            pass

    side_by_side()
    serial, parallel = [], []
    for _ in range(PROBE_ROUNDS):  # alternating, so a burst of other load hits both
        serial.append(timed(probe, device) * threads)
        parallel.append(timed(side_by_side, device))
    serial_s, parallel_s = sorted(serial)[len(serial) // 2], sorted(parallel)[len(parallel) // 2]
    chosen = threads if serial_s >= MIN_SPEEDUP * parallel_s else 1
    return chosen, (f"{chosen} (auto: {threads} batches of {sentences} x beam {beam} took "
                    f"{serial_s * 1e3:.0f} ms one after another on {threads} threads, "
                    f"{parallel_s * 1e3:.0f} ms side by side on one thread each; side by side "
                    f"needs x{MIN_SPEEDUP})")
