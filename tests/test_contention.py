"""Busy cores, read from the process's own CPU time: the meter, when it applies, the
probe's redone rounds and the training loop's warning."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from seq2seq import contention, precision, runtime

CPU = torch.device("cpu")


def test_the_share_is_cpu_seconds_per_wall_second_per_thread() -> None:
    assert contention.Meter(cpu=1.0, wall=1.0).share(2) == pytest.approx(0.5)
    assert contention.Meter(cpu=1.0, wall=1.0).busy(2)
    assert not contention.Meter(cpu=1.9, wall=1.0).busy(2)
    assert not contention.Meter(cpu=0.0, wall=contention.MIN_WALL / 2).busy(2)  # too short to judge
    assert contention.Meter().share(2) == 1.0  # nothing measured reads as free
    assert "52% of its 2 threads'" in contention.describe(0.52, 2)


def test_the_meter_reads_this_process_cpu_time() -> None:
    """Spinning in Python is charged as CPU time; sleeping (as a thread that another
    process keeps off its core) is not. The spin runs until the process was charged 0.1 s,
    so a loaded machine only makes it take longer."""
    spin, sleep = contention.Meter(), contention.Meter()
    spin.start()
    start, deadline = contention.cpu_seconds(), time.perf_counter() + 30
    while contention.cpu_seconds() - start < 0.1 and time.perf_counter() < deadline:
        pass
    spin.stop()
    sleep.start()
    time.sleep(0.2)
    sleep.stop()
    assert spin.cpu >= 0.1 and spin.wall >= 0.09 and spin.share(1) < 1.2
    assert sleep.wall >= 0.2 and sleep.cpu < 0.05 and sleep.busy(1)
    with pytest.raises(RuntimeError, match="without start"):
        contention.Meter().stop()


def test_it_judges_only_cpu_work_with_spinning_threads(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert contention.measurable(CPU)
    assert not contention.measurable(torch.device("cuda"))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert not contention.measurable(CPU)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    assert not contention.measurable(CPU)


class _ScriptedMeter(contention.Meter):
    """A meter whose rounds read busy or free as ``script`` says, one entry per round."""

    script: list[bool] = []

    def busy(self, threads: int | None = None) -> bool:
        return _ScriptedMeter.script.pop(0)

    def share(self, threads: int | None = None) -> float:
        return 0.3


def _probe(monkeypatch, script: list[bool]) -> tuple[precision.Choice, list[int]]:
    """auto's probe over fake passes whose rounds read busy per ``script``. In a busy
    round full bf16 looks 3x faster than the rest; in a free one it is slower."""
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    monkeypatch.setattr(contention, "measurable", lambda device: True)
    monkeypatch.setattr(contention, "Meter", _ScriptedMeter)
    _ScriptedMeter.script = list(script)
    ran: list[int] = []  # which pass each timed call ran

    def timed(step, device) -> float:
        step()
        busy = _ScriptedMeter.script[0] if _ScriptedMeter.script else False
        fast = torch.is_autocast_enabled("cpu")
        return (0.1 if fast else 0.3) if busy else (0.4 if fast else 0.3)

    def make(i: int):
        return lambda: ran.append(i)
    monkeypatch.setattr(precision, "timed", timed)
    passes = [make(i) for i in range(precision.PROBE_BATCHES)]
    return precision.choose("auto", CPU, passes), ran


def test_the_probe_redoes_a_round_on_busy_cores(monkeypatch) -> None:
    choice, ran = _probe(monkeypatch, [True, False, False, False])
    n = len(precision.TRAIN_MODES)
    # a warm-up on pass 0, then each round (the redone one too) on a pass new to every mode
    assert ran == [p for p in range(precision.PROBE_ROUNDS + 2) for _ in range(n)]
    assert choice.name == "fp32"  # the busy round's bf16 times were dropped
    assert "redone on busy cores: round 1 (the process got 30%" in choice.reason
    assert "still on busy cores" not in choice.reason


def test_the_probe_gives_up_redoing_and_says_so(monkeypatch) -> None:
    script = [True] * (precision.PROBE_ROUNDS + precision.BUSY_REDOS)
    choice, ran = _probe(monkeypatch, script)
    n = len(precision.TRAIN_MODES)
    assert ran == [p for p in range(1 + precision.PROBE_ROUNDS + precision.BUSY_REDOS) for _ in range(n)]
    assert choice.reason.count("(the process got 30%") == precision.PROBE_ROUNDS + precision.BUSY_REDOS
    assert "still on busy cores" in choice.reason and "train.threads=1" in choice.reason


def test_training_warns_once_when_its_steps_ran_on_busy_cores(
        tiny_train_overrides, tmp_path: Path, monkeypatch, caplog) -> None:
    """Steps charged a third of their threads' CPU time (a fake clock): one warning
    naming the fix, then a line when the cores are free again."""
    from test_train import train

    from seq2seq.training import loop

    charged = iter([1 / 3] * 6 + [1.0] * 1000)
    clock = {"cpu": 0.0}

    def cpu_seconds() -> float:
        return clock["cpu"]

    real_step = loop.train_step

    def train_step(run, batch, scale):
        start = time.perf_counter()
        loss = real_step(run, batch, scale)
        wall = max(time.perf_counter() - start, contention.MIN_WALL)
        time.sleep(max(0.0, start + wall - time.perf_counter()))
        clock["cpu"] += next(charged) * torch.get_num_threads() * (time.perf_counter() - start)
        return loss

    monkeypatch.setattr(contention, "cpu_seconds", cpu_seconds)
    monkeypatch.setattr(contention, "measurable", lambda device: True)
    monkeypatch.setattr(loop, "train_step", train_step)
    with caplog.at_level(logging.INFO):
        train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=12",
              "train.log_every=2", "train.precision=fp32")
    busy = [r for r in caplog.records if "busy cores" in r.getMessage()]
    assert len(busy) == 1 and busy[0].levelno == logging.WARNING
    assert "steps 1-2 ran on busy cores (the process got 33%" in busy[0].getMessage()
    assert "train.threads=1" in busy[0].getMessage()
    free = [r for r in caplog.records if "free again" in r.getMessage()]
    assert len(free) == 1


def test_no_warning_under_ddp_where_waiting_ranks_sleep(monkeypatch) -> None:
    """A rank waiting for another's gradients is not a busy core."""
    from types import SimpleNamespace

    from seq2seq.runs.log import Window
    from seq2seq.training import distributed, loop

    said: list[str] = []
    log = SimpleNamespace(warning=lambda *a: said.append("warning"), info=lambda *a: said.append("info"))
    run = SimpleNamespace(device=CPU, log=log, progress=SimpleNamespace(step=10), busy_cores=False)
    window = Window()
    window.add(0.0, 100, 100, seconds=1.0, cpu_seconds=0.2)  # a fifth of one thread's time
    monkeypatch.setattr(contention, "measurable", lambda device: True)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    loop.warn_busy_cores(run, window)
    assert said == [] and not run.busy_cores
    monkeypatch.setattr(distributed, "world_size", lambda: 1)
    loop.warn_busy_cores(run, window)
    assert said == ["warning"] and run.busy_cores
