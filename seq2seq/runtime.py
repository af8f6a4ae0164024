"""Where and how a job runs: device choice, torch threads, seeding, bf16 autocast."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seq2seq.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda[:N]`` -> a device; CUDA asked for but absent is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but no CUDA device is visible: "
                          "set the device to auto or cpu")
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


def threads_per_rank(threads: int) -> int:
    """``train.threads`` for this process: 0 (all cores) is split between the ranks that
    torchrun starts on this node (``LOCAL_WORLD_SIZE``)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if threads > 0 or local_world == 1:
        return threads
    return max(1, len(os.sched_getaffinity(0)) // local_world)


def apply_training_settings(train_cfg: Any) -> None:
    """The process-wide settings of a training command: torch's intra-op threads, glibc's
    malloc thresholds (:func:`keep_freed_memory`) and, with ``train.flush_denormals``,
    denormal flushing (which restarts the OpenMP pool). Only command-line entry points
    call this: library functions (``seq2seq.training.loop.train_main`` included) leave
    the process as they find it."""
    set_threads(threads_per_rank(train_cfg.threads))
    keep_freed_memory()
    if train_cfg.flush_denormals:
        flush_denormals()


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.

    A training step frees and re-allocates the same tensors of a few MB every batch, and
    a beam-search step its (rows, vocabulary) logits. By default glibc trims the freed
    top of its heaps and maps larger blocks afresh, so every step faults the same pages
    back in zero-filled, thousands of page faults per batch
    (docs/performance.md#keeping-freed-memory). Blocks up to
    32 MiB (glibc's largest threshold) then come from the heap and freed memory stays
    mapped (the process keeps its peak footprint, which a training job reaches every
    step anyway). Returns False where this is not glibc; a no-op there.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl or another libc
        return False
    # both are set even if one is refused (mallopt returns 0 for a value it rejects)
    mapped = mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    trimmed = mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    return bool(mapped and trimmed)


def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime of torch's intra-op threads (and MKL's), as loaded in this process.

    Other packages bring their own copy (sentencepiece's wheel has a second libgomp), so
    the copy inside torch's package is preferred over any other.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    except OSError:
        return None
    home = os.path.dirname(os.path.dirname(torch.__file__))  # site-packages: torch/, torch.libs/
    for path in sorted(paths, key=lambda p: not p.startswith(os.path.join(home, "torch"))):
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(path)
            if hasattr(lib, "omp_pause_resource_all"):
                return lib
    return None


def denormals_flushed() -> bool:
    """Whether every intra-op thread flushes denormals: a matmul whose true result is
    denormal (~5e-40) splits its rows between the threads and must come out all zero."""
    a = torch.full((512, 512), 1e-20)
    return bool((a @ torch.full((512, 512), 1e-22) == 0).all())


def flush_denormals() -> bool:
    """Treat float32/float64 denormals (|x| < 1.2e-38 in fp32) as zero on the CPU.

    Why: backpropagating through a ~45-step decoder loop and the encoder's recurrence
    leaves many gradient entries that small, above all in the first tens of steps of a
    run, and x86 cores take a slow microcode path for arithmetic on a denormal. Flushing
    them speeds up early training most and later training a little
    (docs/performance.md#denormal-flushing). Values that small are far below anything an
    Adam update can resolve.

    The flag lives in each thread's MXCSR register, and a new thread copies its
    creator's. torch sets it only for the calling thread, so the OpenMP worker threads
    (which MKL's matmuls also run on) are made anew afterwards: ``omp_pause_resource_all``
    frees the pool and the next parallel region starts workers from this thread. Returns
    whether every thread now flushes (False on CPUs or builds where this cannot be set).
    """
    if not torch.set_flush_denormal(True):
        return False
    lib = _openmp_runtime()
    if lib is not None and not denormals_flushed():
        lib.omp_pause_resource_all(1)  # omp_pause_soft: threads end, state stays
    return denormals_flushed()


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 matmuls are native here: CUDA with bf16, or a CPU with AVX512-BF16/AMX.

    Elsewhere bf16 is emulated and slower than fp32, so autocast would only cost accuracy
    (docs/performance.md#bf16-autocast-trainprecisionauto).
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``enabled`` (and supported); a no-op otherwise.

    Parameters, gradients and the optimizer stay fp32; matmuls (the RNN gates, attention,
    the output layer) run in bf16, which on CPUs with native bf16 (AMX) usually makes a
    training step faster (docs/performance.md#bf16-autocast-trainprecisionauto).
    """
    if enabled and bf16_supported(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# the flags that decide which matmul kernels a CPU can run fast
_SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


# environment variables that make torch, oneDNN or MKL use fewer instructions than the
# CPU has (e.g. to stand in for an AVX2-only CPU); a record made under them must say so
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
            "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")
# environment variables that change the speed (or the arithmetic) of torch's CPU kernels
# without capping instructions: oneDNN's kernel cache size and implicit bf16 for fp32,
# thread counts and placement
LIBRARY_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY",
                    "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "KMP_AFFINITY")
_CPUINFO_KEYS = {"model name": "model", "cpu family": "family", "model": "model_number"}


def cpu_description() -> dict[str, Any]:
    """The CPU model, core count, matmul-relevant flags, the vector kernels torch runs, any
    instruction-set caps and library settings (:data:`LIBRARY_SETTINGS`) in force, for
    benchmark records (figures from different machines, or from one machine with and
    without caps or settings, are only comparable with these next to them)."""
    def set_of(names: tuple[str, ...]) -> dict[str, str]:
        return {k: os.environ[k] for k in names if os.environ.get(k)}

    info: dict[str, Any] = {"model": platform.processor() or "unknown", "cores": os.cpu_count(),
                            "flags": [], "kernels": torch.backends.cpu.get_cpu_capability(),
                            "isa_caps": set_of(ISA_CAPS),
                            "library_settings": set_of(LIBRARY_SETTINGS)}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in _CPUINFO_KEYS:
            info[_CPUINFO_KEYS[key.strip()]] = value.strip()
        elif key.strip() == "flags":
            have = set(value.split())
            info["flags"] = [f for f in _SPEED_FLAGS if f in have]
            break
    return info
