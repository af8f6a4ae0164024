"""Paths each process times at start-up and that round differently from their alternatives
(the fp32 GEMM route, the C kernels against torch's ops): recorded in a run's summary and
checkpoints, and kept when the run resumes (docs/performance.md#the-large-products-in-bf16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2seq import native
from seq2seq.model import gemm
from seq2seq.runs import checkpoint

MADE_UP = "a made-up kernel on 1 thread"


def test_choices_name_the_path_each_timed_choice_took(monkeypatch):
    monkeypatch.setattr(native, "_chosen", {"a on 1 thread": (True, "a: kernel (1 ms ...)"),
                                            "b on 2 threads": (False, "b: torch (...)")})
    assert native.choices() == {"a on 1 thread": "kernel", "b on 2 threads": "torch"}
    monkeypatch.setattr(native, "_chosen", {})
    assert native.choices() == {}


def test_kept_choices_are_not_timed_again(monkeypatch):
    monkeypatch.setattr(native, "_chosen", {})
    monkeypatch.setattr(native, "available", lambda: True)
    native.keep({MADE_UP: "torch", "b on 1 thread": "kernel"})
    assert native.choices() == {MADE_UP: "torch", "b on 1 thread": "kernel"}
    assert "(kept from the run's start)" in native.status()
    with monkeypatch.context() as m:  # the torch thread count is in the name: 1 here
        m.setattr("torch.get_num_threads", lambda: 1)
        assert native.choose("a made-up kernel", lambda: pytest.fail("timed again")) is False
        assert native.choose("b", lambda: pytest.fail("timed again")) is True


@pytest.mark.parametrize("route", ["default", "onednn", "grid"])
def test_routes_by_name(route):
    choice = gemm.named(route, "why")
    assert choice.name == route and choice.reason == "why"
    with pytest.raises(ValueError, match="no fp32 GEMM route 'auto'"):
        gemm.named("auto", "why")


def test_a_resumed_run_keeps_its_timed_paths(tiny_train_overrides, tmp_path: Path, monkeypatch):
    """A resume is a new process: without the checkpoint's paths it would time them again,
    and a near tie could take the other path and change the run's arithmetic."""
    from test_train import train

    monkeypatch.setattr(native, "_chosen", {MADE_UP: (True, "a timing")})
    monkeypatch.setattr(gemm, "choose", lambda *a, **k: gemm.named("default", "a probe"))
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=3")
    saved = checkpoint.load_checkpoint(run_dir / "last.pt")["progress"]
    assert saved["native_choices"][MADE_UP] == "kernel" and saved["fp32_gemm"] == "default"
    assert json.loads((run_dir / "summary.json").read_text())["native_choices"][MADE_UP] == "kernel"

    monkeypatch.setattr(native, "_chosen", {})  # as in a new process: nothing timed yet
    monkeypatch.setattr(gemm, "choose", lambda *a, **k: pytest.fail("the route was timed again"))
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=5", "train.resume=true")
    assert native._chosen[MADE_UP][0] is True
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["fp32_gemm"] == "default"
    assert summary["native_choices"][MADE_UP] == "kernel"
    assert "fp32 GEMMs: default (kept from the run's start)" in (run_dir / "train.log").read_text()


@pytest.fixture
def paths_mode(monkeypatch):
    """native's process-wide mode and choices, restored after the test."""
    import threading

    monkeypatch.setattr(native, "_fixed", threading.Event())
    monkeypatch.setattr(native, "_chosen", {})


def test_fixed_paths_take_each_kernel_that_applies_without_timing(paths_mode, monkeypatch):
    monkeypatch.setattr(native, "available", lambda: True)
    monkeypatch.setattr("torch.get_num_threads", lambda: 1)
    native.fix()
    assert native.fixed()
    assert native.choose("applies", lambda: (lambda: pytest.fail("timed"), lambda: 1)) is True
    assert native.choose("does not", lambda: (lambda: pytest.fail("timed"), lambda: None)) is False
    assert native.choices() == {"applies on 1 thread": "kernel", "does not on 1 thread": "torch"}
    assert "applies on 1 thread: kernel (fixed by train.deterministic, not timed)" in native.status()


def test_a_change_of_mode_drops_the_choices_made_in_the_other(paths_mode, monkeypatch):
    monkeypatch.setattr(native, "available", lambda: True)
    monkeypatch.setattr(native, "_chosen", {MADE_UP: (False, "a timing")})
    native.fix(False)  # the mode it was in: nothing dropped
    assert native.choices() == {MADE_UP: "torch"}
    native.fix()
    assert native.choices() == {}
    native.keep({MADE_UP: "torch"})  # a resumed run's paths win over fixed ones
    monkeypatch.setattr("torch.get_num_threads", lambda: 1)
    assert native.choose("a made-up kernel", lambda: pytest.fail("chosen again")) is False
    native.fix(False)
    assert native.choices() == {} and not native.fixed()


def test_deterministic_needs_a_fixed_precision():
    from test_config import make_cfg

    from seq2seq.config import validate
    from seq2seq.errors import ConfigError

    with pytest.raises(ConfigError, match="train.deterministic=true needs a fixed "
                                          "train.precision: auto times the machine"):
        validate(make_cfg("train.deterministic=true", "train.precision=auto"))
    validate(make_cfg("train.deterministic=true", "train.precision=bf16_gemm"))


def test_a_deterministic_run_times_no_path(paths_mode, tiny_train_overrides, tmp_path: Path,
                                           monkeypatch):
    """Every timed choice of a training process is fixed: the fp32 GEMM route is MKL's and
    each kernel that applies is taken, so a busy machine cannot send a seed another way."""
    from test_train import train

    monkeypatch.setattr(gemm, "measure", lambda *a, **k: pytest.fail("the route was timed"))
    monkeypatch.setattr(native, "TRIALS", 0)  # a timing would now fail on an empty median
    first = train(tiny_train_overrides, f"run_dir={tmp_path / 'a'}", "train.max_steps=3",
                  "train.deterministic=true")
    summary = json.loads((first / "summary.json").read_text())
    assert summary["fp32_gemm"] == "default" and summary["native_choices"]
    log = (first / "train.log").read_text()
    assert "fp32 GEMMs: default (MKL; fixed by train.deterministic, not timed)" in log
    if native.available():
        assert "fixed by train.deterministic, not timed" in log.split("native kernels:")[1]
    second = train(tiny_train_overrides, f"run_dir={tmp_path / 'b'}", "train.max_steps=3",
                   "train.deterministic=true")
    assert losses(first)[-1]["dev_loss"] and losses(first) == losses(second)


def losses(run_dir: Path) -> list[dict[str, str]]:
    """Every loss and score metrics.csv logged (not the speeds and times)."""
    import csv

    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if "loss" in k or "ppl" in k or "bleu" in k}
                for row in csv.DictReader(f)]


def test_a_runs_fixed_paths_end_with_it(paths_mode, tiny_train_overrides, tmp_path: Path):
    """The mode is the run's: a process that trains with it, then decodes or trains again,
    times its paths as before."""
    from test_train import train

    native.fix(False)
    train(tiny_train_overrides, f"run_dir={tmp_path / 'a'}", "train.max_steps=2",
          "train.deterministic=true")
    assert not native.fixed()


def test_fixed_routes_are_not_timed_and_an_env_route_still_wins(monkeypatch):
    shapes = ((64, 16, 32),)
    monkeypatch.setattr(gemm, "measure", lambda *a, **k: pytest.fail("the route was timed"))
    monkeypatch.delenv(gemm.ENV, raising=False)
    choice = gemm.choose(torch.device("cpu"), shapes, fixed=True)
    assert choice.name == "default" and "fixed by train.deterministic" in choice.reason
    if gemm.available():
        monkeypatch.setenv(gemm.ENV, "onednn")
        assert gemm.choose(torch.device("cpu"), shapes, fixed=True).name == "onednn"
