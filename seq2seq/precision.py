"""Which precision training and decoding run in (``train.precision``: auto | fp32 | bf16 |
bf16_loss; ``precision`` of `seq2seq-translate`: auto | fp32 | bf16), chosen by measuring.

bf16 autocast runs the matmuls (RNN input and gate projections, attention, the output
layer and loss GEMMs) in bf16 with fp32 accumulation; parameters, gradients, the
optimizer and the softmax/loss stay fp32. Whether that is faster depends on the machine
far more than on its feature flags: a CPU with native bf16 matmuls can still lose the
gain in casts and small per-step matmuls, and one without them emulates bf16 far slower
than fp32 (docs/performance.md#bf16-autocast-trainprecisionauto). So ``auto`` times a
few real passes of the model in each precision (training: forward+backward on real
batches, each timed round on a batch new to every precision; decoding: decoder steps at
the batch size the command decodes with), alternating, and keeps bf16 only when it is
clearly faster (:data:`MIN_SPEEDUP`). The probe changes nothing: no optimizer step, the
gradients are cleared and every RNG state is restored.

``bf16_loss`` (training only) keeps the model fp32 and runs only the fused output layer
and loss's products in bf16 (:func:`seq2seq.model.loss.bf16_products`): about 40% of a
step's time, in three product shapes that recur all run, so oneDNN builds their bf16
kernels once, where full bf16 meets new shapes every batch
(docs/performance.md#bf16-for-the-output-layer-and-loss-only). ``bf16_gemm`` also runs the
model's other products over all positions in bf16, their rows padded so their shapes recur
(seq2seq/model/bf16_gemm.py). Training's ``auto`` times all four: bf16_loss is kept when
it beats fp32 by :data:`MIN_LOSS_SPEEDUP`, bf16_gemm when it beats the best of those by
the same margin, and full bf16 only when it beats the best of the three by
:data:`MIN_SPEEDUP`; each comparison is the median of the two modes' ratio within a round
(:func:`speedup`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from seq2seq import contention, runtime
from seq2seq.config import Precision, TrainPrecision
from seq2seq.errors import ConfigError
from seq2seq.model import bf16_gemm, loss

TRAIN_CHOICES = tuple(TrainPrecision)  # the schema's choices; check() is for library callers
DECODE_CHOICES = tuple(Precision)
MIN_SPEEDUP = 1.15  # full bf16 must save at least this factor of step time to be chosen
# bf16_loss's probe meets the shapes training meets, so a smaller margin covers its noise
MIN_LOSS_SPEEDUP = 1.05
PROBE_ROUNDS = 3  # timed passes per precision, after one untimed warm-up pass each
# rounds in all where the first ones disagree on a comparison (some over its margin, some
# under): one noisy round then no longer decides the median
MAX_PROBE_ROUNDS = 7
BUSY_REDOS = PROBE_ROUNDS  # rounds redone at most because they ran on busy cores
PROBE_BATCHES = 1 + MAX_PROBE_ROUNDS + BUSY_REDOS  # a warm-up, then a new batch for every round
TRAIN_MODES = ("fp32", "bf16_loss", "bf16_gemm", "bf16")  # what training's auto times, least changed first
DECODE_MODES = ("fp32", "bf16")
Pass = Callable[[], None]  # one timed unit of work: a training pass, or a few decoder steps


@dataclass
class Choice:
    """The precision a run trains (or decodes) in, and why: ``bf16`` autocast over the
    model, ``loss_bf16``: only the fused loss's products in bf16, or ``gemm_bf16``:
    those and the other large products (seq2seq/model/bf16_gemm.py)."""

    bf16: bool
    reason: str
    loss_bf16: bool = False
    gemm_bf16: bool = False

    @property
    def name(self) -> str:
        if self.bf16:
            return "bf16"
        return "bf16_gemm" if self.gemm_bf16 else "bf16_loss" if self.loss_bf16 else "fp32"


def of_name(name: str, reason: str = "") -> Choice:
    """The Choice a resolved name (fp32, bf16, bf16_loss, bf16_gemm) stands for, e.g. on
    resume."""
    return Choice(name == "bf16", reason or name, loss_bf16=name in ("bf16_loss", "bf16_gemm"),
                  gemm_bf16=name == "bf16_gemm")


def check(name: str, key: str = "train.precision") -> None:
    choices = TRAIN_CHOICES if key == "train.precision" else DECODE_CHOICES
    if name not in choices:
        if name in TRAIN_CHOICES:
            raise ConfigError(f"{key}={name!r} is for training (it changes the loss's "
                              f"products): use {', '.join(choices)}")
        raise ConfigError(f"{key}={name!r}: use {', '.join(choices)}")


def applied(choice: Choice, device: torch.device) -> contextlib.AbstractContextManager:
    """The block runs in ``choice``'s precision: bf16 autocast, or fp32 with the fused
    loss's products (and, for bf16_gemm, the other large products) in bf16; bf16 only
    where it is native."""
    stack = contextlib.ExitStack()
    stack.enter_context(runtime.autocast(device, choice.bf16))
    if choice.loss_bf16 and runtime.bf16_supported(device):
        stack.enter_context(loss.bf16_products())
        if choice.gemm_bf16:
            stack.enter_context(bf16_gemm.enabled())
    return stack


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Seconds ``step()`` takes on ``device`` (a GPU is synchronized before the clock stops)."""
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def probe(passes: Pass | Sequence[Pass], device: torch.device,
          modes: tuple[str, ...] = DECODE_MODES, sizes: Sequence[float] | None = None
          ) -> dict[str, float]:
    """Median seconds of a pass in each of ``modes`` (:func:`probe_rounds`)."""
    return medians(probe_rounds(passes, device, modes, sizes))


def medians(rounds: dict[str, list[float]]) -> dict[str, float]:
    """Each mode's median over :func:`probe_rounds`' rounds."""
    return {m: _median(v) for m, v in rounds.items()}


class Rounds(dict):
    """Seconds per mode, one per timed round (a ``dict[str, list[float]]``), which rounds
    were redone because other processes took the cores (``redone``) or ran on busy cores
    even so (``busy``), and the comparison whose disagreeing rounds made the probe run more
    than :data:`PROBE_ROUNDS` (``extended``, e.g. ``"bf16_gemm against bf16_loss"``)."""

    def __init__(self, modes: Sequence[str]) -> None:
        super().__init__({m: [] for m in modes})
        self.redone: list[str] = []
        self.busy: list[str] = []
        self.extended = ""


def probe_rounds(passes: Pass | Sequence[Pass], device: torch.device,
                 modes: tuple[str, ...] = DECODE_MODES, sizes: Sequence[float] | None = None
                 ) -> Rounds:
    """Seconds of a pass (one forward+backward, or a few decoder steps) in each of
    ``modes``, one per timed round, measured alternately, the modes taking turns to go
    first.

    Several passes (training: one per batch): every mode warms up on the first, and each
    timed round runs the next one, new to every mode, in all of them. Repeating one batch
    lets bf16 reuse kernels built for its shapes, which training, meeting new shapes
    every batch, rarely can: the repeated batch overstated full bf16
    (docs/performance.md#the-probe-on-new-batches). ``sizes`` (e.g. each batch's target
    tokens) scale each time to the passes' mean size, so rounds on batches of different
    size compare.

    A round during which another process took the cores (seq2seq.contention) is redone,
    up to :data:`BUSY_REDOS` times in all: busy cores slow every mode many times over, and
    some far more than others, so such a round can favour a mode that loses on free cores.

    After :data:`PROBE_ROUNDS` rounds, while a comparison of :func:`_pick`'s ladder is
    undecided (its rounds fall on both sides of its margin, :func:`undecided`), rounds are
    added, up to :data:`MAX_PROBE_ROUNDS`: where two modes differ by about the margin, the
    median of three noisy rounds picks either.
    """
    passes = [passes] if callable(passes) else list(passes)
    sizes = list(sizes) if sizes is not None else [1.0] * len(passes)
    mean = sum(sizes) / len(sizes)
    times = Rounds(modes)
    for mode in modes:  # warm-up: first calls allocate and pick kernels
        with applied(of_name(mode), device):
            timed(passes[0], device)
    judged = contention.measurable(device)
    while (r := len(times[modes[0]])) < MAX_PROBE_ROUNDS:
        if r >= PROBE_ROUNDS:
            if not (why := undecided(times)):
                break
            times.extended = times.extended or why
        tried = r + len(times.redone)  # a redone round runs a new pass too, where there is one
        i = 1 + tried % (len(passes) - 1) if len(passes) > 1 else 0
        meter, got = contention.Meter(), {}
        meter.start()
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            with applied(of_name(mode), device):
                got[mode] = timed(passes[i], device) * mean / sizes[i]
        meter.stop()
        if judged and meter.busy():
            what = f"round {r + 1} ({contention.describe(meter.share())})"
            if len(times.redone) < BUSY_REDOS:
                times.redone.append(what)
                continue
            times.busy.append(what)
        for mode, seconds in got.items():
            times[mode].append(seconds)
    return times


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def choose(name: str, device: torch.device, passes: Pass | Sequence[Pass],
           key: str = "train.precision", what: str = "a training pass",
           sizes: Sequence[float] | None = None) -> Choice:
    """Resolve setting ``key`` = ``name`` on ``device``; each of ``passes`` runs ``what``
    once (one forward+backward pass of a batch of ``sizes`` tokens, or a few decoder
    steps; only called for ``auto`` where bf16 is native; see :func:`probe`). Training's
    auto also times bf16_loss; decoding has no loss to time."""
    check(name, key)
    if name == "fp32":
        return Choice(False, f"{key}=fp32")
    if not runtime.bf16_supported(device):
        why = f"{device} has no native bf16 (emulated bf16 is far slower than fp32)"
        return Choice(False, f"fp32: {why}" if name == "auto" else f"fp32, {key}={name} "
                      f"ignored: {why}")
    if name != "auto":
        return of_name(name, f"{key}={name}")
    modes = TRAIN_MODES if key == "train.precision" else DECODE_MODES
    with _rng_kept(device):
        rounds = probe_rounds(passes, device, modes, sizes)
    return _pick(rounds, what)


def speedup(rounds: dict[str, list[float]], base: str, mode: str) -> float:
    """How many times faster ``mode`` ran than ``base``: the median over the probe's
    rounds of their ratio within a round (both ran the same batch, seconds apart, so a
    machine whose speed drifts, or a batch of another size, moves both alike)."""
    ratios = _ratios(rounds, base, mode)
    return _median(ratios) if ratios else 0.0


def _ratios(rounds: dict[str, list[float]], base: str, mode: str) -> list[float]:
    """``base``'s time over ``mode``'s in each round (rounds where ``mode`` took no time left out)."""
    return [b / t for b, t in zip(rounds[base], rounds[mode], strict=True) if t > 0]


def _margin(mode: str) -> float:
    """How many times faster than the best so far ``mode`` must run to be kept."""
    return MIN_SPEEDUP if mode == "bf16" else MIN_LOSS_SPEEDUP


def _ladder(rounds: dict[str, list[float]]) -> Iterator[tuple[str, str, bool]]:
    """Each comparison of the rule: (best so far, the next mode, whether it is kept), the
    next mode kept when it is faster than the best so far by its margin (:func:`speedup`)."""
    best = "fp32"
    for mode in (m for m in TRAIN_MODES[1:] if m in rounds):
        kept = speedup(rounds, best, mode) >= _margin(mode)
        yield best, mode, kept
        best = mode if kept else best


def undecided(rounds: dict[str, list[float]]) -> str:
    """The first comparison of the rule whose rounds disagree, some of the mode's ratios to
    the best so far over its margin and some under (``"bf16_gemm against bf16_loss"``),
    or ``""`` when every round agrees with every decision."""
    for best, mode, _ in _ladder(rounds):
        above = [ratio >= _margin(mode) for ratio in _ratios(rounds, best, mode)]
        if any(above) and not all(above):
            return f"{mode} against {best}"
    return ""


def _pick(rounds: dict[str, list[float]], what: str) -> Choice:
    """From the probe's per-round seconds per mode: each further change of precision is
    kept only when it is clearly faster (:func:`speedup`) than the best so far."""
    seconds = medians(rounds)
    best = "fp32"
    for _, mode, kept in _ladder(rounds):
        best = mode if kept else best
    took = ", ".join(f"{seconds[m] * 1e3:.0f} ms in {m}" for m in seconds)
    if "bf16_loss" in seconds:
        ratios = ", ".join(f"{m} x{speedup(rounds, 'fp32', m):.2f}" for m in rounds if m != "fp32")
        needs = (f"within rounds over fp32: {ratios}; bf16_loss, then bf16_gemm, need "
                 f"x{MIN_LOSS_SPEEDUP} over the best before them, bf16 x{MIN_SPEEDUP}")
    else:
        needs = f"x{speedup(rounds, 'fp32', 'bf16'):.2f}; bf16 needs x{MIN_SPEEDUP}"
    # each round's times too: a probe disturbed in most of its rounds (stop 49's benchmark
    # once read fp32-model modes at 1.5-2.7x their usual time) shows in them
    per_round = "; ".join(f"{m} {'/'.join(f'{t * 1e3:.0f}' for t in rounds[m])}" for m in rounds)
    return of_name(best, f"{best} (auto: {what} took {took}; {needs}; ms per round: "
                   f"{per_round}{_busy_note(rounds)})")


def more_rounds_note(rounds: dict[str, list[float]]) -> str:
    """"7 rounds: the first 3 disagreed on bf16_gemm against bf16_loss" where
    :func:`probe_rounds` ran more than :data:`PROBE_ROUNDS` rounds, else ``""``."""
    if not (extended := getattr(rounds, "extended", "")):
        return ""
    return (f"{len(next(iter(rounds.values())))} rounds: the first {PROBE_ROUNDS} "
            f"disagreed on {extended}")


def _busy_note(rounds: dict[str, list[float]]) -> str:
    """Why :func:`probe_rounds` ran more rounds, and what it redid or kept on busy cores,
    for the log line."""
    note = f"; {more}" if (more := more_rounds_note(rounds)) else ""
    if redone := getattr(rounds, "redone", []):
        note += f"; redone on busy cores: {', '.join(redone)}"
    if busy := getattr(rounds, "busy", []):
        note += (f"; still on busy cores: {', '.join(busy)}, so the choice may be wrong: "
                 f"{contention.ADVICE}")
    return note


@contextlib.contextmanager
def _rng_kept(device: torch.device):
    """Every RNG the probe's dropout draws from is restored afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield
