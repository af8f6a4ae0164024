"""Paired timing: two training processes that take turns on the CPU, group by group.

On a shared machine the speed drifts by tens of percent within seconds (a fixed bf16
matmul timed between training groups ranged 403-837 GFLOP/s in one minute on machine B,
docs/performance.md). Timing ours and then JoeyNMT minutes apart puts that drift into
every ratio. ``scripts/benchmark.py --paired-rounds N`` instead starts both at once and
lets them run one at a time, alternating from the start: our first warm-up group,
JoeyNMT's first (untimed) logging window, our second warm-up group, ..., then our timed
group 1, JoeyNMT's timed window 1, our group 2, ... Each pair is measured seconds apart,
and the process not running sleeps (it is never timed while the other runs). The warm-up
alternates too: after one whole warm-up before JoeyNMT's (four minutes asleep), our first
timed group was the slowest of its round in 5 of 6 rounds (stop 34).

The protocol uses plain files in a folder per child, so both sides need only the standard
library (JoeyNMT's environment imports this file too): the conductor writes ``go.N`` to
hand the child its N-th turn, and the child writes ``done.N`` when that turn's work is
over. A child that exits before its turn is done is an error naming its log.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "BENCH_TURNS"  # the folder of a child's turn files; unset = run freely
POLL_S = 0.005


class Turns:
    """A child's side: ``take()`` blocks until its next turn, ``give()`` ends that turn.

    Without a folder (``BENCH_TURNS`` unset) both are no-ops, so the same code runs unpaired.
    """

    def __init__(self, folder: str | Path | None) -> None:
        self.folder = Path(folder) if folder else None
        self.taken = self.given = 0

    def take(self) -> None:
        if self.folder is None:
            return
        go = self.folder / f"go.{self.taken}"
        while not go.exists():
            time.sleep(POLL_S)
        self.taken += 1

    def give(self) -> None:
        if self.folder is None:
            return
        (self.folder / f"done.{self.given}").touch()
        self.given += 1


def patch_joey_trainer(trainer: Any, turns: Turns) -> None:
    """Make JoeyNMT 2.3.0's ``TrainManager`` end a turn at each of its logging windows.

    ``train_and_validate`` restarts a window's clock (``start = time.time()``) right after
    ``_log_scores`` returns, so waiting there for the next turn keeps the wait out of its
    "Tokens per Sec" windows.
    """
    log = trainer._log_scores

    def log_scores(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = log(self, *args, **kwargs)
        turns.give()
        turns.take()
        return out

    trainer._log_scores = log_scores


def hook_joey() -> None:
    """Called by bench_joey's wrapper before JoeyNMT starts. With BENCH_TURNS set, it waits
    for its first turn (JoeyNMT's start-up and first, untimed, window) and pairs the rest.

    JoeyNMT is imported only once that turn comes: importing it (torch and its own modules)
    takes seconds of CPU, which would otherwise run beside our first turn, where our child's
    start-up probes time the precisions and GEMM routes it then trains with."""
    folder = os.environ.get(ENV)
    if folder:
        turns = Turns(folder)
        turns.take()
        from joeynmt.training import TrainManager

        patch_joey_trainer(TrainManager, turns)


class Child:
    """The conductor's handle on one child process and its turn folder."""

    def __init__(self, name: str, proc: subprocess.Popen, folder: Path, log: Path) -> None:
        self.name, self.proc, self.folder, self.log = name, proc, folder, log
        self.turns = 0

    def turn(self, timeout: float) -> float:
        """Give the child its next turn and wait until it is over; returns its wall seconds."""
        start = time.perf_counter()
        (self.folder / f"go.{self.turns}").touch()
        done = self.folder / f"done.{self.turns}"
        while not done.exists():
            if self.proc.poll() is not None:
                raise ChildFailed(f"{self.name} exited (status {self.proc.returncode}) during "
                                  f"turn {self.turns}; see {self.log}")
            if time.perf_counter() - start > timeout:
                raise ChildFailed(f"{self.name} did not end turn {self.turns} within {timeout:.0f} s "
                                  f"(does it take turns?); see {self.log}")
            time.sleep(POLL_S)
        self.turns += 1
        return time.perf_counter() - start

    def release(self) -> None:
        """Its last turn: it runs to the end on its own."""
        (self.folder / f"go.{self.turns}").touch()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


class ChildFailed(RuntimeError):
    """A paired child died before its turn was over."""


def start(name: str, cmd: list[str], folder: Path, env: dict[str, str], log: Path,
          cwd: str | Path | None = None) -> Child:
    """Launch ``cmd`` with its turn folder in BENCH_TURNS, stdout and stderr to ``log``."""
    folder.mkdir(parents=True, exist_ok=False)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, env={**env, ENV: str(folder)}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd)
    return Child(name, proc, folder, log)


def conduct(first: Child, second: Child, pairs: int,
            on_turn: Callable[[str, int, float], None] | None = None,
            timeout: float = 3600) -> None:
    """Run two children turn by turn, ``first`` first, ``pairs`` turns each (warm-up turns
    included: both keep the same rhythm from the start). Then ``second`` runs to its end
    alone, then ``first``. ``timeout``: seconds for any one turn and for each child's end.
    A failure stops both."""
    try:
        for _ in range(pairs):
            for child in (first, second):
                _report(on_turn, child, child.turn(timeout))
        for child in (second, first):
            child.release()
            if child.wait(timeout) != 0:
                raise ChildFailed(f"{child.name} failed (status {child.proc.returncode}); "
                                  f"see {child.log}")
    finally:
        for child in (first, second):
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()


def _report(on_turn: Callable[[str, int, float], None] | None, child: Child, sec: float) -> None:
    if on_turn is not None:
        on_turn(child.name, child.turns - 1, sec)
