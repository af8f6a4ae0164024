"""Fused C kernels, compiled on first use for this CPU, chosen by timing.

Two parts of a batched beam-search step are chains of memory-bound torch ops that no
library fuses on a CPU (``torch.compile`` was measured slower,
docs/performance.md#native-decoding-kernels): the additive attention scores and the
vocabulary side (log-softmax and top-k). ``kernels.c`` does each in one pass; the
scores also with their gradients, for fp32 training.

- **Build** (:mod:`seq2seq.native.build`). The C compiler (``$CC``, else Python's,
  else ``cc``) builds ``kernels.c`` with ``-march=native`` into
  ``~/.cache/seq2seq/native`` (``$SEQ2SEQ_CACHE`` or ``$XDG_CACHE_HOME`` move it),
  keyed by the source, the flags, the compiler and the CPU (about half a second on
  machine E). It needs no headers or libc at link time.
- **Choice.** Each kernel is used only where a timing on a synthetic problem, once per
  process and dtype, finds it faster than the torch ops it replaces (:func:`choose`);
  after :func:`fix` (``train.deterministic``) wherever it applies, untimed.
- **Fallback.** No compiler, a failed build or ``SEQ2SEQ_NATIVE=0``: the torch path
  runs, with one line on stderr for a failed build. Results agree within fp32 rounding
  (tests/test_native.py); outputs may differ where two hypotheses nearly tie.
- **Threads.** Every kernel splits its rows into blocks over
  torch's own OpenMP threads (``kernels.c``, "Blocks of rows over torch's threads"), as
  many as ``torch.get_num_threads()``; a block has at least :data:`MIN_BLOCK` elements.
  The kernels release the GIL (ctypes), so decoding workers
  (seq2seq/inference/workers.py), each on one torch thread, run them side by side.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from seq2seq.native import build

__all__ = ["additive_scores", "additive_scores_backward", "available", "choices", "choose",
           "cross_entropy_rows", "disabled", "fix", "fixed", "fixed_paths", "gru_gates",
           "gru_gates_backward", "keep", "status", "vocab_topk"]

MIN_BLOCK = 65536  # elements a thread's block of rows covers at least: fewer cost more to hand out
TRIALS = 5  # timed calls of each path in a choice, alternating, after one untimed call

_lock = threading.Lock()
_trial_lock = threading.RLock()  # one timing at a time: decoding workers may ask together
_state: dict[str, object] = {}  # "lib": the CDLL or None, "why": its status line
_chosen: dict[str, tuple[bool, str]] = {}
_off = threading.Event()  # set inside disabled()
_fixed = threading.Event()  # set by fix(): choose() takes each kernel that applies, untimed

_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _load() -> ctypes.CDLL | None:
    if "lib" in _state:  # every kernel call asks: no lock once loaded
        return _state["lib"]  # type: ignore[return-value]
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, why = None, ""
        cc = build.compiler()
        if os.environ.get("SEQ2SEQ_NATIVE", "1") == "0":
            why = "off (SEQ2SEQ_NATIVE=0)"
        elif platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
            why = f"off (built only on Linux x86-64, not {platform.system()} {platform.machine()})"
        elif cc is None:
            why = "off (no C compiler: install gcc, or set CC, for faster decoding)"
        else:
            try:
                path, temporary = build.build(cc)
                lib = ctypes.CDLL(str(path))
                if temporary:  # loaded (mapped) now: the file is no longer needed
                    shutil.rmtree(path.parent, ignore_errors=True)
                lib.additive_scores.argtypes = [_P, _P, _P, _F, _I64, _I64, _I64, _I64,
                                                ctypes.c_int, _P, ctypes.c_int]
                lib.additive_scores.restype = None
                lib.additive_scores_backward.argtypes = [_P, _P, _P, _P, _I64, _I64, _I64,
                                                         _I64, _P, _P, _P, ctypes.c_int,
                                                         ctypes.c_int]
                lib.additive_scores_backward.restype = None
                lib.cross_entropy_rows.argtypes = [_P, ctypes.c_int, _I64, _I64, _P, _F, _P, _P,
                                                   ctypes.c_int, _P, _P, ctypes.c_int]
                lib.cross_entropy_rows.restype = None
                lib.vocab_topk.argtypes = [_P, _I64, _I64, _I64, _P, _I64, ctypes.c_int, _P, _P,
                                           ctypes.c_int]
                lib.vocab_topk.restype = None
                lib.gru_gates.argtypes = [_P, _P, _P, _I64, _I64, _P, _P, ctypes.c_int]
                lib.gru_gates.restype = None
                lib.gru_gates_backward.argtypes = [_P, _P, _P, _P, _I64, _I64, _P, _P, _P,
                                                   ctypes.c_int]
                lib.gru_gates_backward.restype = None
                why = f"on ({Path(cc).name}, {path})"
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                lib = None
                why = f"off (the C build failed: {err}); torch ops instead"
                print(f"note: seq2seq's native kernels: {why}", file=sys.stderr,
                      flush=True)
        _state.update(lib=lib, why=why)
        return lib


def _lib() -> ctypes.CDLL | None:
    """The loaded kernels, or None when they are missing or switched off."""
    return None if _off.is_set() else _load()


def available() -> bool:
    """True when the kernels are built and loaded (and not switched off)."""
    return _lib() is not None


def status() -> str:
    """One line: whether the kernels are on, and each choice made so far."""
    _load()
    parts = [str(_state["why"])] + [why for _, why in _chosen.values()]
    return "; ".join(parts)


def choices() -> dict[str, str]:
    """Each choice made so far, "kernel" or "torch", by its name (with the thread count).
    A run's summary keeps them: the paths round differently, so two runs of one seed
    train alike only where these agree."""
    return {name: "kernel" if use else "torch" for name, (use, _) in _chosen.items()}


def keep(kept: dict[str, str]) -> None:
    """Take the paths of :func:`choices` (a resumed run's, from its checkpoint) without
    timing them again; a choice not in ``kept`` is still timed when first asked for."""
    for name, path in kept.items():
        _chosen[name] = (path == "kernel", f"{name}: {path} (kept from the run's start)")


def fix(on: bool = True) -> None:
    """With ``on``, :func:`choose` takes the kernel wherever it is available and applies,
    without timing it: every process of one command then takes the same paths, however
    loaded the machine (``train.deterministic``). A change of mode drops the choices made
    so far; a choice :func:`keep` takes afterwards still wins."""
    if on != _fixed.is_set():
        _chosen.clear()
    (_fixed.set if on else _fixed.clear)()


def fixed() -> bool:
    """True after :func:`fix`: the timed paths of this process are fixed, not timed."""
    return _fixed.is_set()


@contextmanager
def fixed_paths(on: bool) -> Iterator[None]:
    """:func:`fix` (``on``) inside the block, the mode before it afterwards: a run's setting,
    not the process's (a reproduction trains, then decodes, in one process)."""
    before = fixed()
    fix(on)
    try:
        yield
    finally:
        fix(before)


@contextmanager
def disabled() -> Iterator[None]:
    """Inside the block every caller takes its torch path (A/B timings, tests)."""
    _off.set()
    try:
        yield
    finally:
        _off.clear()


def choose(name: str, trial: Callable[[], tuple[Callable[[], object], Callable[[], object]]],
           margin: float = 1.0) -> bool:
    """True when kernel ``name`` is available and faster here than its torch path.

    ``trial()`` returns (torch path, kernel) as calls on one synthetic problem; they are
    timed once per process, ``name`` and torch thread count (median of :data:`TRIALS`,
    alternating). A kernel that does not apply to the problem (it returns None, e.g. for
    float64) is not timed: torch. ``margin``: how many times faster the kernel must be.
    Two runs of the same seed take the same path only if their timings agree, and a path
    that rounds differently from torch's changes the last bits of every result; a margin
    keeps a near tie on one side.
    """
    if not available():
        return False
    # per thread count: decoding workers run on one thread, a lone batch on all of them,
    # and only the torch path spreads over threads
    threads = torch.get_num_threads()
    name = f"{name} on {threads} thread{'s' if threads > 1 else ''}"
    if name in _chosen:
        return _chosen[name][0]
    import time

    # a trial with gradients may be asked for from inside inference mode (decoding)
    with _trial_lock, torch.inference_mode(False):
        if name in _chosen:  # timed by another thread meanwhile
            return _chosen[name][0]
        eager, fast = trial()
        if fast() is None:
            _chosen[name] = (False, f"{name}: torch (the kernel does not apply)")
            return False
        if _fixed.is_set():
            _chosen[name] = (True, f"{name}: kernel (fixed by train.deterministic, not timed)")
            return True
        eager()
        times: dict[str, list[float]] = {"eager": [], "fast": []}
        for _ in range(TRIALS):
            for label, fn in (("eager", eager), ("fast", fast)):
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
        e, f = (sorted(times[k])[TRIALS // 2] for k in ("eager", "fast"))
        use = f * margin < e
        needs = f"; needs x{margin:.2f}" if margin != 1.0 else ""
        _chosen[name] = (use, f"{name}: {'kernel' if use else 'torch'} (kernel {f * 1e3:.2f} "
                              f"ms, torch {e * 1e3:.2f} ms{needs})")
        return use


def _ptr(t: Tensor) -> int:
    return t.data_ptr()


def blocks(rows: int, per_row: int) -> int:
    """Into how many blocks a kernel splits ``rows`` rows of ``per_row`` elements each: one
    per torch thread, each of at least :data:`MIN_BLOCK` elements, at least one."""
    return max(1, min(torch.get_num_threads(), rows * per_row // MIN_BLOCK))


def additive_scores(q2: Tensor, keys: Tensor, v: Tensor) -> Tensor | None:
    """Additive attention scores 2 vᵀσ(q2 + 2 keys) - Σv in one pass, or None where the
    kernel does not apply (library missing, a GPU tensor, mixed or other dtypes).

    q2: (B, A) or (B, G, A) = 2 W q (G queries per memory row); keys: (B, S, A), the same
    dtype (fp32 or bf16); v: (A,) or (1, A). Returns float32 (B, S) or (B, G, S).
    """
    lib = _lib()
    if lib is None or q2.device.type != "cpu" or keys.device.type != "cpu" \
            or q2.dtype != keys.dtype or q2.dtype not in (torch.float32, torch.bfloat16):
        return None
    one = q2.dim() == 2
    q = (q2.unsqueeze(1) if one else q2).contiguous()
    keys = keys.contiguous()
    w = v.detach().reshape(-1).float().contiguous()
    (b, g, a), s = q.shape, keys.size(1)
    if keys.shape != (b, s, a) or w.numel() != a:
        return None
    out = torch.empty(b, g, s, dtype=torch.float32)
    lib.additive_scores(_ptr(q), _ptr(keys), _ptr(w), float(w.sum()), b, g, s, a,
                        int(q.dtype == torch.bfloat16), _ptr(out), blocks(b, g * s * a))
    return out.squeeze(1) if one else out


def additive_scores_backward(q2: Tensor, keys: Tensor, v: Tensor, grad: Tensor,
                             add_keys_to: Tensor | None = None
                             ) -> tuple[Tensor, Tensor | None, Tensor]:
    """The gradients of :func:`additive_scores` for fp32 CPU inputs (the caller checks):
    grad (B, [G,] S) -> grads of q2 (B, [G,] A), keys (B, S, A) and v (shaped as v).
    With ``add_keys_to`` (contiguous fp32, keys' shape) the keys' gradient is added into
    it instead, and None returned for it."""
    lib = _load()
    assert lib is not None, "additive_scores_backward needs the built kernels"
    one = q2.dim() == 2
    q = (q2.unsqueeze(1) if one else q2).contiguous()
    g = (grad.unsqueeze(1) if one else grad).float().contiguous()
    keys = keys.contiguous()
    w = v.detach().reshape(-1).float().contiguous()
    (b, groups, a), s = q.shape, keys.size(1)
    grad_q = torch.empty_like(q)
    grad_k = _into(add_keys_to, keys) if add_keys_to is not None else torch.empty_like(keys)
    parts = blocks(b, groups * s * a)
    grad_v = w.new_empty(parts, a)  # v's gradient sums over rows: one sum a block
    lib.additive_scores_backward(_ptr(q), _ptr(keys), _ptr(w), _ptr(g), b, groups, s, a,
                                 _ptr(grad_q), _ptr(grad_k), _ptr(grad_v),
                                 int(add_keys_to is not None), parts)
    return ((grad_q.squeeze(1) if one else grad_q), None if add_keys_to is not None else grad_k,
            grad_v.sum(0).view_as(v))


def cross_entropy_rows(logits: Tensor, target: Tensor, smoothing: float,
                       grad_dtype: torch.dtype | None, grad_bias: Tensor | None = None,
                       grad_out: Tensor | None = None) -> tuple[Tensor, Tensor | None] | None:
    """The fused loss's softmax part (seq2seq/model/loss.py) for logits (n, V), fp32 or
    bf16, and targets (n,): the summed cross-entropy (0-dim fp32, torch's label
    smoothing) and, with ``grad_dtype``, its gradient softmax - (1-ε) onehot - ε/V as
    (n, V) in that dtype (fp32 or bf16), also added to ``grad_bias`` (V,) fp32 when given,
    written into ``grad_out`` (contiguous, (n, V), grad_dtype) when given, which may be
    the logits themselves (each row is read in full before its gradient is written).
    None where the kernel does not apply."""
    lib = _lib()
    ok_dtypes = (torch.float32, torch.bfloat16)
    if lib is None or logits.device.type != "cpu" or logits.dim() != 2 \
            or logits.dtype not in ok_dtypes or grad_dtype not in (*ok_dtypes, None) \
            or (grad_bias is not None and (grad_bias.dtype != torch.float32
                                           or not grad_bias.is_contiguous())):
        return None
    n, width = logits.shape
    x = logits.contiguous()
    y = target.to(torch.int64).contiguous()
    if n and not 0 <= int(y.min()) <= int(y.max()) < width:  # torch's path names the error
        return None
    rows = torch.empty(n, dtype=torch.float32)
    grad = None if grad_dtype is None else torch.empty(n, width, dtype=grad_dtype) \
        if grad_out is None else grad_out
    if grad_out is not None and (grad_out.shape != (n, width) or grad_out.dtype != grad_dtype
                                 or not grad_out.is_contiguous()):
        raise ValueError(f"grad_out must be contiguous {grad_dtype} {(n, width)}, got "
                         f"{grad_out.dtype} {tuple(grad_out.shape)}")
    parts = blocks(n, width)
    work = torch.empty(parts, width, dtype=torch.float32)
    # the bias's gradient sums over rows: one block adds into it, several into a sum each
    sums = None if grad is None or grad_bias is None else \
        grad_bias.unsqueeze(0) if parts == 1 else torch.zeros(parts, width)
    lib.cross_entropy_rows(_ptr(x), int(x.dtype == torch.bfloat16), n, width, _ptr(y),
                           float(smoothing), _ptr(rows), 0 if grad is None else _ptr(grad),
                           int(grad_dtype == torch.bfloat16), 0 if sums is None else _ptr(sums),
                           _ptr(work), parts)
    if sums is not None and parts > 1:
        grad_bias += sums.sum(0)  # type: ignore[operator]
    return rows.sum(), grad


def vocab_topk(logits: Tensor, k: int, skip: Sequence[int] = ()) -> tuple[Tensor, Tensor] | None:
    """Per row of logits (N, V) its ``k`` largest log-probabilities, best first, (N, k)
    float32, and their token ids (N, k) long, in one pass; None where the kernel does
    not apply. Ids in ``skip`` count in the softmax but are never chosen."""
    lib = _lib()
    if lib is None or logits.device.type != "cpu" or logits.dim() != 2 \
            or logits.dtype not in (torch.float32, torch.bfloat16):
        return None
    n, width = logits.shape
    if not 1 <= k <= width - len(skip):
        return None
    x = logits.contiguous()
    skip_ids = torch.tensor(list(skip), dtype=torch.int64)
    vals = torch.empty(n, k, dtype=torch.float32)
    idx = torch.empty(n, k, dtype=torch.int64)
    lib.vocab_topk(_ptr(x), n, width, k, _ptr(skip_ids), len(skip),
                   int(x.dtype == torch.bfloat16), _ptr(vals), _ptr(idx), blocks(n, width))
    return vals, idx


def gru_gates(gi: Tensor, gh: Tensor, h: Tensor, out: Tensor | None = None,
              keep: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """A GRU's gates from its products gi, gh (rows, 3H) and state h (rows, H), all fp32
    on the CPU: the new state (rows, H) and what the backward needs (rows, 3H: r, z, n),
    or None where the kernel does not apply. ``out``, ``keep``: contiguous fp32 tensors
    of those shapes to write into (e.g. a step's slot in a sequence's buffer)."""
    lib = _lib()
    if lib is None or any(t.device.type != "cpu" or t.dtype != torch.float32
                          for t in (gi, gh, h)):
        return None
    rows, width = h.shape
    if gi.shape != (rows, 3 * width) or gh.shape != gi.shape:
        return None
    gi, gh, h = gi.contiguous(), gh.contiguous(), h.contiguous()
    out = _into(out, h)
    keep = _into(keep, gi)
    lib.gru_gates(_ptr(gi), _ptr(gh), _ptr(h), rows, width, _ptr(out), _ptr(keep),
                  blocks(rows, 3 * width))
    return out, keep


def gru_gates_backward(grad: Tensor, keep: Tensor, gh: Tensor, h: Tensor,
                       grad_gi: Tensor | None = None, grad_gh: Tensor | None = None
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`gru_gates` (which the caller ran): grad (rows, H) ->
    grads of gi, gh (rows, 3H) and h (rows, H); ``grad_gi``, ``grad_gh``: contiguous
    fp32 tensors to write those two into."""
    lib = _load()
    assert lib is not None, "gru_gates_backward needs the built kernels"
    grad, gh, h = grad.float().contiguous(), gh.contiguous(), h.contiguous()
    rows, width = h.shape
    grad_gi, grad_gh = _into(grad_gi, keep), _into(grad_gh, keep)
    grad_h = torch.empty_like(h)
    lib.gru_gates_backward(_ptr(grad), _ptr(keep), _ptr(gh), _ptr(h), rows, width,
                           _ptr(grad_gi), _ptr(grad_gh), _ptr(grad_h), blocks(rows, 3 * width))
    return grad_gi, grad_gh, grad_h


def _into(out: Tensor | None, like: Tensor) -> Tensor:
    """``out`` checked to take a kernel's result shaped and typed as ``like``, or a new one."""
    if out is None:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    if out.shape != like.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"a kernel's output buffer must be contiguous fp32 {tuple(like.shape)},"
                         f" got {out.dtype} {tuple(out.shape)}")
    return out
