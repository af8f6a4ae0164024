"""Which library runs fp32 matrix products on the CPU, chosen by measuring.

PyTorch's CPU build sends fp32 ``mm``/``addmm``/``bmm`` (every ``nn.Linear``, the
attention scores, the output layer and the loss GEMMs, and their backward passes) to
MKL. Setting ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` sends them to
oneDNN instead, which *may* compute them with bf16 inputs. Whether it does depends on
the CPU: where oneDNN has no bf16 kernel for the shape it keeps fp32 arithmetic, and on
some CPUs its fp32 kernels are much faster than MKL's (MKL picks slower code paths on
CPUs it does not recognise; docs/performance.md#fp32-gemms-through-onednn).

So nothing is assumed from the CPU's name or flags. :func:`choose` multiplies a few
matrices of the model's shapes both ways, alternately, and keeps oneDNN only when

* its results are as accurate as fp32 (relative error against a float64 product at most
  :data:`MAX_REL_ERROR`; bf16 inputs give about 1e-3), so training and decoding stay
  fp32 in every digit that matters, and
* it is clearly faster (:data:`MIN_SPEEDUP`).

The probe draws from its own random generator: the global RNG, and so a seeded run's
dropout and batch order, is the same whichever route is chosen. ``SEQ2SEQ_FP32_GEMM``
(``auto``, ``onednn``, ``default``) overrides the choice, for benchmarks and for
comparing the two routes; it is read here and nowhere else. The setting is
process-wide, so commands apply it with :func:`using`, which restores what it found.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from seq2seq.errors import ConfigError

ENV = "SEQ2SEQ_FP32_GEMM"
ROUTES = ("auto", "onednn", "default")
MAX_REL_ERROR = 1e-5  # fp32 products of these sizes err by ~3e-7; bf16 inputs by ~1e-3
MIN_SPEEDUP = 1.1  # oneDNN must save at least this factor of GEMM time to be chosen
# (M, K, N) of the products that dominate a step at the benchmark's sizes: the output
# layer of a batch slice (rows x hidden x vocab) and a gate projection (rows x 3*hidden).
PROBE_SHAPES = ((256, 256, 8000), (96, 768, 768))
PROBE_ROUNDS = 5  # timed products per route and shape, after warm-up


@dataclass(frozen=True)
class Choice:
    """The route fp32 GEMMs take (``onednn`` or ``default``) and why."""

    onednn: bool
    reason: str

    @property
    def name(self) -> str:
        return "onednn" if self.onednn else "default"


DEFAULT = Choice(False, "default (MKL)")


def available() -> bool:
    """Whether this torch can route fp32 GEMMs through oneDNN."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.backends.mkldnn, "matmul") \
        and hasattr(torch.backends.mkldnn.matmul, "fp32_precision")


@contextlib.contextmanager
def using(choice: Choice) -> Iterator[None]:
    """fp32 GEMMs take ``choice``'s route inside the block; the previous setting after it."""
    if not available():
        yield
        return
    flags = torch.backends.mkldnn.matmul
    before = flags.fp32_precision
    flags.fp32_precision = "bf16" if choice.onednn else "none"
    try:
        yield
    finally:
        flags.fp32_precision = before


def _product_error(a: torch.Tensor, b: torch.Tensor) -> float:
    exact = a.double() @ b.double()
    return float((a @ b).double().sub_(exact).norm() / exact.norm())


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - start


def measure(shapes: tuple[tuple[int, int, int], ...] = PROBE_SHAPES,
            rounds: int = PROBE_ROUNDS) -> dict[str, dict[str, float]]:
    """For each route (``default``, ``onednn``): the largest relative error of its
    products against float64 and the summed median seconds over ``shapes``. Timed
    alternately, so a machine that slows down mid-probe slows both routes."""
    gen = torch.Generator().manual_seed(0)  # not the global RNG: seeded runs stay identical
    mats = [(torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen))
            for m, k, n in shapes]
    routes = {"default": Choice(False, ""), "onednn": Choice(True, "")}
    out = {name: {"rel_error": 0.0, "seconds": 0.0} for name in routes}
    for a, b in mats:
        times: dict[str, list[float]] = {name: [] for name in routes}
        for name, route in routes.items():  # warm-up: oneDNN builds its kernel per shape
            with using(route):
                out[name]["rel_error"] = max(out[name]["rel_error"], _product_error(a, b))
                _seconds(a, b)
        for _ in range(rounds):
            for name, route in routes.items():
                with using(route):
                    times[name].append(_seconds(a, b))
        for name, t in times.items():
            out[name]["seconds"] += sorted(t)[len(t) // 2]
    return out


def decide(measured: dict[str, dict[str, float]]) -> Choice:
    """The route :func:`measure`'s figures call for (see the module's rules)."""
    base, fast = measured["default"], measured["onednn"]
    speedup = base["seconds"] / fast["seconds"] if fast["seconds"] > 0 else 0.0
    figures = (f"{base['seconds'] * 1e3:.1f} ms with MKL, {fast['seconds'] * 1e3:.1f} ms "
               f"with oneDNN, x{speedup:.2f}; relative error {fast['rel_error']:.1e} "
               f"against {base['rel_error']:.1e}")
    if fast["rel_error"] > MAX_REL_ERROR:
        return Choice(False, f"default (MKL): oneDNN rounds to lower precision ({figures})")
    if speedup < MIN_SPEEDUP:
        return Choice(False, f"default (MKL): oneDNN is not x{MIN_SPEEDUP} faster ({figures})")
    return Choice(True, f"oneDNN ({figures})")


def forced() -> str:
    """``SEQ2SEQ_FP32_GEMM``, checked: auto (the default), onednn or default."""
    name = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if name not in ROUTES:
        raise ConfigError(f"{ENV}={name!r}: use auto, onednn or default")
    return name


def choose(device: torch.device) -> Choice:
    """The route for fp32 GEMMs on ``device`` (measured once per process; a GPU and a
    torch without oneDNN keep the default)."""
    name = forced()
    if device.type != "cpu" or not available():
        return DEFAULT if name != "onednn" else Choice(
            False, f"default: {ENV}=onednn ignored, {device} has no oneDNN matmul route")
    if name == "default":
        return Choice(False, f"default (MKL), {ENV}=default")
    if name == "onednn":
        return Choice(True, f"oneDNN, {ENV}=onednn")
    return _measured_choice()


@functools.lru_cache(maxsize=1)
def _measured_choice() -> Choice:
    return decide(measure())
