"""Paths each process times at start-up and that round differently from their alternatives
(the fp32 GEMM route, the C kernels against torch's ops): recorded in a run's summary and
checkpoints, and kept when the run resumes (docs/performance.md#the-large-products-in-bf16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
