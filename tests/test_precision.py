"""train.precision: fp32 / bf16 / auto, where auto keeps bf16 only when timed passes say so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from seq2seq import precision, runtime
from seq2seq.errors import ConfigError

CPU = torch.device("cpu")


def _step(fp32_s: float, bf16_s: float, calls: list[bool]):
    """A fake training pass that takes the given time in each precision and draws randoms."""
    def step() -> None:
        bf16 = torch.is_autocast_enabled("cpu")
        calls.append(bf16)
        torch.rand(3)
        time.sleep(bf16_s if bf16 else fp32_s)
    return step


def test_fp32_and_unsupported_bf16_never_probe(monkeypatch) -> None:
    calls: list[bool] = []
    assert precision.choose("fp32", CPU, _step(0, 0, calls)).bf16 is False
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: False)
    auto = precision.choose("auto", CPU, _step(0, 0, calls))
    forced = precision.choose("bf16", CPU, _step(0, 0, calls))
    assert not auto.bf16 and not forced.bf16 and "no native bf16" in auto.reason
    assert "ignored" in forced.reason and calls == []


def test_auto_takes_bf16_only_when_clearly_faster(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    calls: list[bool] = []
    fast = precision.choose("auto", CPU, _step(0.02, 0.005, calls))
    assert fast.bf16 and "20 ms in fp32, 5 ms in bf16" in fast.reason
    assert calls.count(True) == calls.count(False) == precision.PROBE_ROUNDS + 1
    slow = precision.choose("auto", CPU, _step(0.01, 0.02, []))
    assert not slow.bf16 and slow.reason.startswith("fp32 (auto")
    assert precision.choose("bf16", CPU, _step(0.01, 0.02, [])).bf16  # asked for: kept


def test_probe_restores_the_random_state(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    precision.choose("auto", CPU, _step(0.0, 0.0, []))
    assert torch.equal(torch.rand(4), expected)


def test_unknown_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="train.precision='fp16'"):
        precision.check("fp16")


def test_training_records_the_choice_and_a_resume_keeps_it(tiny_train_overrides, tmp_path: Path,
                                                           monkeypatch) -> None:
    from test_train import train

    run_dir = tmp_path / "run"
    monkeypatch.setattr(precision, "MIN_SPEEDUP", 0.0)  # any bf16 time wins, where bf16 is native
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=3", "train.precision=auto")
    chosen = json.loads((run_dir / "summary.json").read_text())["precision"]
    assert chosen == ("bf16" if runtime.bf16_supported(CPU) else "fp32")
    assert "precision: " in (run_dir / "train.log").read_text()
    monkeypatch.setattr(precision, "MIN_SPEEDUP", 1e9)  # would now pick fp32
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=5", "train.precision=auto",
          "train.resume=true")
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == chosen
    assert f"precision: {chosen} (kept from the run's start)" in (run_dir / "train.log").read_text()
