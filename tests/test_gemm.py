"""seq2seq.gemm: fp32 GEMMs go through oneDNN only where a probe shows it fp32-accurate and
faster; the probe leaves the process as it found it, and training records the route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2seq import gemm
from seq2seq.errors import ConfigError

CPU = torch.device("cpu")
needs_route = pytest.mark.skipif(not gemm.available(), reason="this torch has no oneDNN matmul route")


def _figures(default_s: float, onednn_s: float, onednn_err: float) -> dict[str, dict[str, float]]:
    return {"default": {"seconds": default_s, "rel_error": 3e-7},
            "onednn": {"seconds": onednn_s, "rel_error": onednn_err}}


def test_decide_needs_fp32_accuracy_and_a_clear_speedup() -> None:
    assert gemm.decide(_figures(0.010, 0.004, 4e-7)).onednn
    rounds = gemm.decide(_figures(0.010, 0.001, 2e-3))  # ten times faster, but bf16 inputs
    assert not rounds.onednn and "rounds to lower precision" in rounds.reason
    slow = gemm.decide(_figures(0.010, 0.0095, 4e-7))
    assert not slow.onednn and "not x1.1 faster" in slow.reason


def test_the_error_bound_separates_fp32_from_bf16_inputs() -> None:
    """What a route that rounds its inputs to bf16 errs by, measured the probe's way, is
    far above MAX_REL_ERROR; a plain fp32 product is far below it."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(256, 256, generator=gen), torch.randn(256, 800, generator=gen)
    with gemm.using(gemm.DEFAULT):
        assert gemm._product_error(a, b) < gemm.MAX_REL_ERROR / 10
        assert gemm._product_error(a.bfloat16().float(), b.bfloat16().float()) < gemm.MAX_REL_ERROR
    exact = a.double() @ b.double()
    rounded = (a.bfloat16().float() @ b.bfloat16().float()).double()
    assert float((rounded - exact).norm() / exact.norm()) > 10 * gemm.MAX_REL_ERROR


@needs_route
def test_using_restores_the_flag_even_after_an_error() -> None:
    flags = torch.backends.mkldnn.matmul
    before = flags.fp32_precision
    with pytest.raises(RuntimeError), gemm.using(gemm.Choice(True, "")):
        assert flags.fp32_precision == "bf16"
        raise RuntimeError("boom")
    assert flags.fp32_precision == before


@needs_route
def test_measure_leaves_the_global_rng_and_the_flag_alone() -> None:
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.manual_seed(7)
    expected = torch.rand(5)
    torch.manual_seed(7)
    figures = gemm.measure(shapes=((16, 32, 64),), rounds=2)
    assert torch.equal(torch.rand(5), expected)
    assert torch.backends.mkldnn.matmul.fp32_precision == before
    assert set(figures) == {"default", "onednn"}
    assert all(f["seconds"] > 0 for f in figures.values())
    assert figures["default"]["rel_error"] < gemm.MAX_REL_ERROR


@needs_route
def test_onednn_route_gives_fp32_gradients() -> None:
    """The fast route against the plain one: a model's loss and gradients agree to fp32
    accuracy wherever the probe would pick it (a route that rounds is refused)."""
    if gemm._product_error(*_route_inputs()) > gemm.MAX_REL_ERROR:
        pytest.skip("oneDNN rounds to bf16 on this CPU: choose() refuses it here")
    from model_helpers import reverse_task

    from seq2seq.config import AttentionConfig, ModelConfig
    from seq2seq.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(emb_size=32, hidden_size=64, dropout=0.0,
                                    attention=AttentionConfig(name="bahdanau")), 12, 12)
    src, lens, tgt_in, tgt_out = reverse_task()
    grads = []
    for route in (gemm.DEFAULT, gemm.Choice(True, "")):
        model.zero_grad()
        with gemm.using(route):
            model(src, lens, tgt_in, targets=tgt_out).backward()  # the fused training loss
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert not torch.equal(grads[0], torch.zeros_like(grads[0]))


def _route_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 256, generator=gen), torch.randn(256, 512, generator=gen)
    return a, b


@pytest.mark.parametrize("value, onednn", [("onednn", True), ("default", False)])
def test_the_environment_forces_a_route(monkeypatch, value: str, onednn: bool) -> None:
    monkeypatch.setenv(gemm.ENV, value)
    choice = gemm.choose(CPU)
    assert choice.onednn is (onednn and gemm.available())
    assert gemm.ENV in choice.reason


def test_a_bad_route_name_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv(gemm.ENV, "mkl")
    with pytest.raises(ConfigError, match="SEQ2SEQ_FP32_GEMM='mkl': use auto, onednn or default"):
        gemm.choose(CPU)


def test_a_gpu_keeps_the_default() -> None:
    assert not gemm.choose(torch.device("cuda")).onednn


@pytest.mark.parametrize("route", ["onednn", "default"])
def test_training_logs_and_records_the_route(tiny_train_overrides, tmp_path: Path, monkeypatch,
                                             route: str) -> None:
    from test_train import train

    monkeypatch.setenv(gemm.ENV, route)
    before = torch.backends.mkldnn.matmul.fp32_precision if gemm.available() else None
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=3")
    name = route if gemm.available() else "default"
    assert json.loads((run_dir / "summary.json").read_text())["fp32_gemm"] == name
    assert "fp32 GEMMs: " in (run_dir / "train.log").read_text()
    if gemm.available():  # a library call leaves the process's setting as it found it
        assert torch.backends.mkldnn.matmul.fp32_precision == before
