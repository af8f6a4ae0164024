"""Which library runs the fused loss's fp32 matrix products on the CPU, chosen by measuring.

PyTorch's CPU build sends fp32 ``mm``/``addmm`` to MKL. With
``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` it sends them to oneDNN instead,
which *may* compute them with bf16 inputs. Whether it does depends on the CPU: where
oneDNN has no bf16 kernel for the shape it keeps fp32 arithmetic, and on some CPUs its
fp32 kernels are far faster than MKL's (MKL takes slower code paths on CPUs it does not
recognise; docs/performance.md#fp32-gemms-through-onednn).

oneDNN builds a kernel for each shape (and strides) it meets and caches it: a few ms
and about 0.65 MB each. A training step meets ~100 shapes it has never seen (rows =
batch x length, per-step batch sizes, attention over each batch's source length), so
routing *every* product through oneDNN builds kernels all the time, and either evicts
them (default cache: 1,024) or grows by GBs (a larger cache). The products whose shapes
recur are the fused output layer and loss (:mod:`seq2seq.model.loss`): full chunks of
``CHUNK_ROWS`` rows, three shapes for a whole run, and about 40% of a step. They go
through oneDNN as they are (:func:`recurring`). The route ``grid`` also sends every
other product through oneDNN, its varying sides rounded up to a grid of a few hundred
shapes (:mod:`seq2seq.model.gemm_grid`), so the kernel cache stays small.

Nothing is assumed from the CPU's name or flags. :func:`choose` multiplies the loss
chunk's three products both ways, alternately, and keeps oneDNN only when

* its results are as accurate as fp32 (relative error against a float64 product at most
  :data:`MAX_REL_ERROR`; bf16 inputs give about 1e-3), so training stays fp32, and
* it is clearly faster (:data:`MIN_SPEEDUP`);

and then takes the grid route too only when the decoder step's products, padded the
grid's way, are faster still by :data:`MIN_GRID_SPEEDUP` (padding, the copies and the
Python glue around each product cost part of the gain).

Training in bf16 leaves no fp32 products, and torch sends bf16 products to oneDNN
anyway; there the grid can only save kernel builds, against its padding and Python.
On the one CPU measured it did not pay overall, while a probe of new step shapes
favoured it (docs/performance.md#bf16-products-on-the-grid-stop-33), so bf16 products
stay as they are unless ``SEQ2SEQ_BF16_GEMM=grid`` asks for it (:func:`for_bf16`; the
benchmark's ``--bf16-grid`` rows time it beside the default on other CPUs).

The probe draws from its own random generator: the global RNG, and so a seeded run's
dropout and batch order, is the same whichever route is chosen. ``SEQ2SEQ_FP32_GEMM``
(``auto``, ``grid``, ``onednn``, ``default``) overrides the choice, for benchmarks and for
comparing the two routes, and ``SEQ2SEQ_BF16_GEMM`` (``default``, ``grid``) the bf16
one; they are read here and nowhere else. Commands apply a choice with
:func:`using`, which restores what it found.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from seq2seq.errors import ConfigError
from seq2seq.model import gemm_grid

ENV = "SEQ2SEQ_FP32_GEMM"
ROUTES = ("auto", "grid", "onednn", "default")
MAX_REL_ERROR = 1e-5  # fp32 products of these sizes err by ~3e-7; bf16 inputs by ~1e-3
MIN_SPEEDUP = 1.1  # oneDNN must save at least this factor of GEMM time to be chosen
# the grid route also pads, copies and runs Python around every product, and in a
# training step other work (attention, pointwise ops) dilutes what the GEMMs gain
MIN_GRID_SPEEDUP = 1.25  # a judgement: on machine B the probe read x1.3-1.8 where training gained x1.07-1.11
GRID_PROBE_ROUNDS = 25  # small products: more rounds for a steady median
GRID_PROBE_ROWS = 61  # off the grid, so the probe pays the padding as training does
PROBE_ROUNDS = 5  # timed products per route and shape, after one warm-up each
BF16_ENV = "SEQ2SEQ_BF16_GEMM"
BF16_ROUTES = ("default", "grid")
Shape = tuple[int, int, int]  # (M, K, N) of an (M, K) @ (K, N) product
Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Choice:
    """The route of the fp32 GEMMs and why: ``onednn`` (the loss chunks through
    oneDNN), ``grid`` (those and every other product, padded to the grid) or
    ``default`` (MKL)."""

    onednn: bool
    reason: str
    grid: bool = False
    bf16_grid: bool = False  # bf16 products (training in bf16) on the grid too
    bf16_reason: str = ""

    @property
    def name(self) -> str:
        return "grid" if self.grid else "onednn" if self.onednn else "default"

    @property
    def bf16_name(self) -> str:
        return "grid" if self.bf16_grid else "as_is"

    @property
    def grid_dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes whose products this route puts on the grid."""
        return tuple(dtype for dtype, on in ((torch.float32, self.grid),
                                             (torch.bfloat16, self.bf16_grid)) if on)


DEFAULT = Choice(False, "default (MKL)")
_active = DEFAULT  # what recurring() follows; set by using()


def available() -> bool:
    """Whether this torch can route fp32 GEMMs through oneDNN."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    return torch.backends.mkldnn.is_available() and hasattr(matmul, "fp32_precision")


@contextlib.contextmanager
def using(choice: Choice) -> Iterator[None]:
    """Products under :func:`recurring` take ``choice``'s route inside the block, and
    with the grid route every other CPU product of the process goes on the grid."""
    global _active
    before, _active = _active, choice
    try:
        dtypes = choice.grid_dtypes if available() else ()
        with gemm_grid.on_grid(dtypes) if dtypes else contextlib.nullcontext():
            yield
    finally:
        _active = before


def recurring() -> contextlib.AbstractContextManager:
    """Wrap fp32 products whose shapes recur all run long: they go through oneDNN when
    the active choice says so (each new shape costs oneDNN a kernel build and a cache
    entry, so nothing else should)."""
    if _active.onednn and available():
        return gemm_grid.flag(True)
    return contextlib.nullcontext()


def _product_error(a: torch.Tensor, b: torch.Tensor, product: Product = torch.mm) -> float:
    exact = a.double() @ b.double()
    return float(product(a, b).double().sub_(exact).norm() / exact.norm())


def _probe(shapes: tuple[Shape, ...], rounds: int,
           routes: dict[str, tuple[Callable[[], contextlib.AbstractContextManager], Product]]
           ) -> dict[str, dict[str, float]]:
    """For each route name -> (context it runs in, product): the largest relative error
    of its products against float64 and the summed median seconds over ``shapes``.
    Timed alternately, so a machine that slows down mid-probe slows every route."""
    gen = torch.Generator().manual_seed(0)  # not the global RNG: seeded runs stay identical
    out = {name: {"rel_error": 0.0, "seconds": 0.0} for name in routes}
    for m, k, n in shapes:
        a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
        times: dict[str, list[float]] = {name: [] for name in routes}
        for name, (context, product) in routes.items():  # also the warm-up: kernels are built
            with context():
                out[name]["rel_error"] = max(out[name]["rel_error"], _product_error(a, b, product))
        for _ in range(rounds):
            for name, (context, product) in routes.items():
                with context():
                    start = time.perf_counter()
                    product(a, b)
                    times[name].append(time.perf_counter() - start)
        for name, t in times.items():
            out[name]["seconds"] += sorted(t)[len(t) // 2]
    return out


def measure(shapes: tuple[Shape, ...], rounds: int = PROBE_ROUNDS) -> dict[str, dict[str, float]]:
    """:func:`_probe`'s figures for ``shapes`` on MKL (``default``) and through oneDNN
    as they are (``onednn``)."""
    return _probe(shapes, rounds, {"default": (lambda: gemm_grid.flag(False), torch.mm),
                                   "onednn": (lambda: gemm_grid.flag(True), torch.mm)})


def measure_grid(shapes: tuple[Shape, ...], rounds: int = GRID_PROBE_ROUNDS
                 ) -> dict[str, dict[str, float]]:
    """:func:`_probe`'s figures for ``shapes`` multiplied by MKL as they are
    (``default``) and padded onto the grid through oneDNN (``onednn``,
    :func:`seq2seq.model.gemm_grid.mm`)."""
    return _probe(shapes, rounds, {"default": (contextlib.nullcontext, torch.mm),
                                   "onednn": (contextlib.nullcontext, gemm_grid.mm)})


def _speedup(measured: dict[str, dict[str, float]]) -> float:
    """MKL's seconds over oneDNN's in :func:`_probe`'s figures (0 if oneDNN took none)."""
    fast = measured["onednn"]["seconds"]
    return measured["default"]["seconds"] / fast if fast > 0 else 0.0


def decide(measured: dict[str, dict[str, float]]) -> Choice:
    """The route :func:`measure`'s figures call for (see the module's rules)."""
    base, fast = measured["default"], measured["onednn"]
    speedup = _speedup(measured)
    figures = (f"{base['seconds'] * 1e3:.1f} ms with MKL, {fast['seconds'] * 1e3:.1f} ms "
               f"with oneDNN, x{speedup:.2f}; relative error {fast['rel_error']:.1e} "
               f"against {base['rel_error']:.1e}")
    if fast["rel_error"] > MAX_REL_ERROR:
        return Choice(False, f"default (MKL): oneDNN rounds to lower precision ({figures})")
    if speedup < MIN_SPEEDUP:
        return Choice(False, f"default (MKL): oneDNN is not x{MIN_SPEEDUP} faster ({figures})")
    return Choice(True, f"oneDNN ({figures})")


def decide_grid(loss: Choice, measured: dict[str, dict[str, float]]) -> Choice:
    """``loss`` (the loss chunks' route), widened to the grid route when
    :func:`measure_grid`'s figures for the step's products call for it."""
    if not loss.onednn:
        return loss
    fast, speedup = measured["onednn"], _speedup(measured)
    figures = f"step products on the grid x{speedup:.2f}, relative error {fast['rel_error']:.1e}"
    if fast["rel_error"] > MAX_REL_ERROR or speedup < MIN_GRID_SPEEDUP:
        return Choice(True, f"{loss.reason}; the rest on MKL ({figures}, "
                            f"needs x{MIN_GRID_SPEEDUP})")
    return Choice(True, f"{loss.reason}; the rest on the oneDNN grid ({figures})", grid=True)


def named(name: str, reason: str) -> Choice:
    """The route whose :attr:`Choice.name` is ``name`` (grid, onednn or default): what a
    resumed run keeps from its start."""
    if name not in ROUTES[1:]:
        raise ValueError(f"no fp32 GEMM route {name!r}: {', '.join(ROUTES[1:])}")
    return Choice(name != "default", reason, grid=name == "grid")


def for_bf16(route: Choice, device: torch.device) -> Choice:
    """``route`` for a run whose products are bf16 (training under bf16 autocast): the
    fp32 grid off (no fp32 products are left for it), and the bf16 products as they are
    or, with ``SEQ2SEQ_BF16_GEMM=grid``, on the grid."""
    route = replace(route, grid=False, bf16_grid=False)
    name = forced(BF16_ENV, BF16_ROUTES, "default")
    if device.type != "cpu" or not available():
        return replace(route, bf16_reason=f"as they are (no grid for {device} in this torch)")
    if name == "grid":
        return replace(route, bf16_grid=True, bf16_reason=f"on the grid, {BF16_ENV}=grid")
    return replace(route, bf16_reason=f"as they are ({BF16_ENV}=grid puts them on the grid)")


def step_probe(model: torch.nn.Module) -> tuple[Shape, ...]:
    """The decoder step's products at :data:`GRID_PROBE_ROWS` rows
    (``Decoder.step_shapes``); () for a model without them (the reference model)."""
    shapes = getattr(model.decoder, "step_shapes", None)
    return shapes(GRID_PROBE_ROWS) if shapes is not None else ()


def forced(env: str = ENV, routes: tuple[str, ...] = ROUTES, unset: str = "auto") -> str:
    """``env`` (``SEQ2SEQ_FP32_GEMM`` or ``SEQ2SEQ_BF16_GEMM``), checked against
    ``routes``; ``unset`` when it is not set."""
    name = os.environ.get(env, unset).strip().lower() or unset
    if name not in routes:
        raise ConfigError(f"{env}={name!r}: use {', '.join(routes[:-1])} or {routes[-1]}")
    return name


def choose(device: torch.device, shapes: tuple[Shape, ...] | None,
           step: tuple[Shape, ...] = (), fixed: bool = False) -> Choice:
    """The route for the fp32 GEMMs on ``device``: ``shapes`` are the loss chunks'
    (:func:`seq2seq.model.loss.chunk_shapes`; None: the model has no fused loss, and
    nothing is routed), ``step`` the decoder step's products
    (:meth:`seq2seq.model.decoder.Decoder.step_shapes`; empty: no grid route). A GPU and
    a torch without oneDNN keep the default. ``fixed`` (``train.deterministic``): the
    default, not timed, unless :data:`ENV` names a route."""
    if shapes is None:
        return Choice(False, "default (MKL): this model has no fused loss")
    name = forced()
    if device.type != "cpu" or not available():
        return DEFAULT if name != "onednn" else Choice(
            False, f"default: {ENV}=onednn ignored, {device} has no oneDNN matmul route")
    forced_because = {"default": "default (MKL)", "onednn": "oneDNN for the loss chunks",
                      "grid": "oneDNN for the loss chunks and the grid for the rest"}
    if name in forced_because:
        return named(name, f"{forced_because[name]}, {ENV}={name}")
    if fixed:
        return named("default", "default (MKL; fixed by train.deterministic, not timed)")
    loss = decide(measure(shapes))
    return decide_grid(loss, measure_grid(step)) if step and loss.onednn else loss
