"""Building the C kernels (``kernels.c``) for this CPU, cached per source, flags,
compiler and CPU (seq2seq/native/__init__.py loads them)."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels.c")
# no -ffast-math: linked into a shared library it would set flush-to-zero for the whole
# process; these flags allow the vectorized reductions without that side effect
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
         "-fassociative-math", "-fno-signed-zeros", "-freciprocal-math", "-fPIC", "-shared",
         "-nostdlib")
# the vector width follows torch's kernel level, so ATEN_CPU_CAPABILITY=avx2 (an AVX2-only
# CPU emulated on an AVX-512 one, docs/performance.md) caps these kernels as it caps torch's
WIDTH_FLAGS = {"AVX512": ("-mprefer-vector-width=512",),
               "AVX2": ("-mno-avx512f", "-mprefer-vector-width=256")}


def flags(capability: str | None = None) -> tuple[str, ...]:
    """The compiler flags for torch's CPU kernel level ``capability`` (default: this
    process's, ``torch.backends.cpu.get_cpu_capability()``): AVX-512 code only where torch
    runs AVX-512 itself, AVX2 code only where torch runs AVX2 or better."""
    level = capability or torch.backends.cpu.get_cpu_capability()
    return FLAGS + WIDTH_FLAGS.get(level, ("-mno-avx512f", "-mno-avx2"))


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else Python's, else ``cc`` or ``gcc``."""
    configured = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "")
    for name in (configured.split()[:1] or []) + ["cc", "gcc"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def cache_dir() -> Path:
    root = os.environ.get("SEQ2SEQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "seq2seq")
    return Path(root) / "native"


def _cpu_key() -> str:
    """The CPU's model and flags (``-march=native`` builds for exactly these)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "|".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.machine() + platform.processor()


def build(cc: str) -> tuple[Path, bool]:
    """The compiled library for this source, flags, compiler and CPU (built if missing),
    and whether it lies in a temporary folder (the cache could not be written)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.split("\n")[0]
    build_flags = flags()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(build_flags), cc, version,
                                    _cpu_key()]).encode()).hexdigest()[:16]
    folder, temporary = cache_dir(), False
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: build for this process only
        folder, temporary = Path(tempfile.mkdtemp(prefix="seq2seq-native-")), True
    target = folder / f"kernels-{key}.so"
    if target.exists():
        return target, temporary
    tmp = folder / f".kernels-{key}-{os.getpid()}-{threading.get_ident()}.so"
    done = subprocess.run([cc, *build_flags, str(SOURCE), "-o", str(tmp)], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError((done.stderr.strip().splitlines() or ["no message"])[-1])
    os.replace(tmp, target)  # atomic: a concurrent build of the same key wins or loses whole
    return target, temporary
