"""seq2seq.model.gemm: fp32 GEMMs go through oneDNN only where a probe shows it fp32-accurate and
faster; the probe leaves the process as it found it, and training records the route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from seq2seq import runtime
from seq2seq.errors import ConfigError
from seq2seq.model import gemm

CPU = torch.device("cpu")
SHAPES = ((32, 16, 64), (32, 64, 16), (64, 32, 16))
needs_route = pytest.mark.skipif(not gemm.available(), reason="this torch has no oneDNN matmul route")


def _figures(default_s: float, onednn_s: float, onednn_err: float) -> dict[str, dict[str, float]]:
    return {"default": {"seconds": default_s, "rel_error": 3e-7},
            "onednn": {"seconds": onednn_s, "rel_error": onednn_err}}


def test_decide_grid_widens_only_a_oneDNN_loss_route_that_the_step_products_favour() -> None:
    loss = gemm.Choice(True, "loss")
    assert gemm.decide_grid(loss, _figures(0.010, 0.005, 4e-7)).grid
    slow = gemm.decide_grid(loss, _figures(0.010, 0.009, 4e-7))
    assert slow.onednn and not slow.grid and "the rest on MKL" in slow.reason
    rounds = gemm.decide_grid(loss, _figures(0.010, 0.001, 2e-3))
    assert rounds.onednn and not rounds.grid
    mkl = gemm.Choice(False, "mkl")
    assert gemm.decide_grid(mkl, _figures(0.010, 0.001, 4e-7)) is mkl
    assert [c.name for c in (gemm.Choice(True, "", grid=True), loss, mkl)] == ["grid", "onednn", "default"]


def test_the_step_probe_is_the_decoder_rnns_products() -> None:
    from seq2seq.config import ModelConfig
    from seq2seq.config.schema import ModelImpl
    from seq2seq.model import build_model

    model = build_model(ModelConfig(emb_size=16, hidden_size=24), 30, 50)  # bahdanau
    rows, rnn_in = gemm.GRID_PROBE_ROWS, 16 + 2 * 24  # embedding and the bidirectional context
    assert gemm.step_probe(model) == ((rows, rnn_in, 72), (rows, 24, 72))
    reference = build_model(ModelConfig(emb_size=16, hidden_size=24, impl=ModelImpl.reference), 30, 50)
    assert gemm.step_probe(reference) == ()


@needs_route
def test_using_the_grid_route_sends_products_to_the_grid_and_then_gives_them_back() -> None:
    from seq2seq.model import gemm_grid

    a, b = torch.randn(37, 64), torch.randn(64, 48)
    start = gemm_grid.calls["grid"]
    with pytest.raises(RuntimeError), gemm.using(gemm.Choice(True, "test", grid=True)):
        torch.mm(a, b)
        assert gemm_grid.calls["grid"] == start + 1
        raise RuntimeError("boom")
    torch.mm(a, b)
    with gemm.using(ONEDNN):  # the loss-chunk route alone leaves other products alone
        torch.mm(a, b)
    assert gemm_grid.calls["grid"] == start + 1


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
    assert gemm._product_error(a, b) < gemm.MAX_REL_ERROR / 10
    exact = a.double() @ b.double()
    rounded = (a.bfloat16().float() @ b.bfloat16().float()).double()
    assert float((rounded - exact).norm() / exact.norm()) > 10 * gemm.MAX_REL_ERROR


ONEDNN = gemm.Choice(True, "test")


@needs_route
def test_recurring_follows_the_active_choice_and_restores_the_flag() -> None:
    flags = torch.backends.mkldnn.matmul
    before = flags.fp32_precision
    with gemm.recurring():  # no choice made: the default route
        assert flags.fp32_precision == before
    with pytest.raises(RuntimeError), gemm.using(ONEDNN):
        assert flags.fp32_precision == before  # using() alone routes nothing
        with gemm.recurring():
            assert flags.fp32_precision == "bf16"
            raise RuntimeError("boom")
    assert flags.fp32_precision == before
    with gemm.recurring():  # using() ended: the default again
        assert flags.fp32_precision == before


@needs_route
def test_measure_leaves_the_global_rng_and_the_flag_alone() -> None:
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.manual_seed(7)
    expected = torch.rand(5)
    torch.manual_seed(7)
    figures = gemm.measure(((16, 32, 64), (16, 64, 32)), rounds=2)
    assert torch.equal(torch.rand(5), expected)
    assert torch.backends.mkldnn.matmul.fp32_precision == before
    assert set(figures) == {"default", "onednn"}
    assert all(f["seconds"] > 0 for f in figures.values())
    assert figures["default"]["rel_error"] < gemm.MAX_REL_ERROR


class _RouteLog(TorchDispatchMode):
    """Rows of each mm/addmm call and the route flag it ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                    torch.ops.aten.addmm_.default):
            rows = args[-2].size(0)
            self.calls.append((rows, torch.backends.mkldnn.matmul.fp32_precision))
        return func(*args, **(kwargs or {}))


@needs_route
def test_only_full_loss_chunks_take_onednn_and_match_the_plain_loss(onednn_rel_error: float
                                                                   ) -> None:
    """The fused loss under the oneDNN route: full chunks' products go through oneDNN,
    the shorter last chunk's stay on MKL (its shape changes every batch), and the loss
    and gradients equal plain cross-entropy's to fp32 accuracy, or to bf16 accuracy on a
    CPU where oneDNN's "fp32" products take bf16 inputs (AMX: there ``gemm.choose``
    refuses the route, and only a forced one, as here, takes it)."""
    from seq2seq.model.loss import CHUNK_ROWS, linear_cross_entropy

    gen = torch.Generator().manual_seed(3)
    n, h, v = 2 * CHUNK_ROWS + 37, 32, 300
    x = torch.randn(n, h, generator=gen).requires_grad_()
    w = (0.1 * torch.randn(v, h, generator=gen)).requires_grad_()
    b = torch.zeros(v).requires_grad_()
    target = torch.randint(0, v, (n,), generator=gen)
    log = _RouteLog()
    with gemm.using(ONEDNN), log:
        fused = linear_cross_entropy(x, w, b, target)
    fused_grads = torch.autograd.grad(fused, (x, w, b))
    plain = F.cross_entropy(F.linear(x, w, b), target, reduction="sum")
    plain_grads = torch.autograd.grad(plain, (x, w, b))
    if onednn_rel_error <= gemm.MAX_REL_ERROR:
        assert torch.allclose(fused, plain, rtol=1e-5)
        for got, want in zip(fused_grads, plain_grads, strict=True):
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    else:  # bf16 inputs: ~3 significant digits per product, accumulated in fp32
        assert torch.allclose(fused, plain, rtol=1e-3)
        for got, want in zip(fused_grads, plain_grads, strict=True):
            assert float((got - want).norm() / want.norm()) < onednn_rel_error
    routes = {rows: flag for rows, flag in log.calls if rows in (CHUNK_ROWS, 37)}
    assert routes[CHUNK_ROWS] == "bf16" and routes[37] != "bf16"
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"


@pytest.mark.parametrize("value, onednn, grid", [("grid", True, True), ("onednn", True, False),
                                                 ("default", False, False)])
def test_the_environment_forces_a_route(monkeypatch, value: str, onednn: bool, grid: bool) -> None:
    monkeypatch.setenv(gemm.ENV, value)
    choice = gemm.choose(CPU, SHAPES, ((8, 16, 48),))
    assert choice.onednn is (onednn and gemm.available())
    assert choice.grid is (grid and gemm.available())
    assert gemm.ENV in choice.reason


def test_a_bad_route_name_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv(gemm.ENV, "mkl")
    with pytest.raises(ConfigError, match="SEQ2SEQ_FP32_GEMM='mkl': use auto, grid, onednn or default"):
        gemm.choose(CPU, SHAPES)


def test_chunk_shapes_are_the_output_layers_and_none_without_a_fused_loss(monkeypatch) -> None:
    from seq2seq.config import ModelConfig
    from seq2seq.config.schema import ModelImpl
    from seq2seq.model import build_model
    from seq2seq.model.loss import CHUNK_ROWS, chunk_shapes

    model = build_model(ModelConfig(emb_size=16, hidden_size=24), 30, 50)
    assert chunk_shapes(model) == ((CHUNK_ROWS, 24, 50), (CHUNK_ROWS, 50, 24), (50, CHUNK_ROWS, 24))
    reference = build_model(ModelConfig(emb_size=16, hidden_size=24, impl=ModelImpl.reference), 30, 50)
    assert chunk_shapes(reference) is None
    monkeypatch.setenv(gemm.ENV, "onednn")  # nothing to route: the override does not apply
    assert gemm.choose(CPU, None) == gemm.Choice(False, "default (MKL): this model has no fused loss")


def test_a_gpu_keeps_the_default() -> None:
    assert not gemm.choose(torch.device("cuda"), SHAPES).onednn


@pytest.mark.parametrize("route", ["grid", "onednn", "default"])
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


def test_the_reference_model_keeps_the_default_route(tiny_train_overrides, tmp_path: Path,
                                                     monkeypatch) -> None:
    """The plain reference model has no fused loss, so there is nothing to route or probe."""
    from test_train import train

    monkeypatch.setenv(gemm.ENV, "onednn")
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=2",
                    "model.impl=reference")
    assert json.loads((run_dir / "summary.json").read_text())["fp32_gemm"] == "default"
    assert "fp32 GEMMs: default (MKL): this model has no fused loss" in (run_dir / "train.log").read_text()


needs_bf16 = pytest.mark.skipif(not (gemm.available() and runtime.bf16_supported(CPU)),
                                reason="no oneDNN route or no native bf16 on this CPU")


@needs_bf16
@pytest.mark.parametrize("route", ["grid", "default"])
def test_bf16_training_records_its_products_route(tiny_train_overrides, tmp_path: Path, monkeypatch,
                                                  route: str) -> None:
    """Under bf16 no fp32 products are left, so the fp32 grid is off; the bf16 products
    take the grid or stay as they are, as SEQ2SEQ_BF16_GEMM forces."""
    from test_train import train

    from seq2seq.model import gemm_grid

    monkeypatch.setenv(gemm.ENV, "grid")
    monkeypatch.setenv(gemm.BF16_ENV, route)
    start = gemm_grid.calls["grid"]
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=2",
                    "train.precision=bf16")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["fp32_gemm"] == "onednn"
    assert summary["bf16_gemm"] == {"grid": "grid", "default": "as_is"}[route]
    log = (run_dir / "train.log").read_text()
    assert ("bf16 GEMMs: on the grid, SEQ2SEQ_BF16_GEMM=grid" if route == "grid" else
            "bf16 GEMMs: as they are (SEQ2SEQ_BF16_GEMM=grid puts them on the grid)") in log
    assert (gemm_grid.calls["grid"] > start) is (route == "grid")
    start = gemm_grid.calls["grid"]
    torch.mm(torch.randn(9, 32), torch.randn(32, 16))  # and torch's kernels are back
    assert gemm_grid.calls["grid"] == start


@pytest.mark.parametrize("value, grid", [("grid", True), ("default", False), ("", False)])
def test_for_bf16_turns_the_fp32_grid_off_and_follows_the_environment(monkeypatch, value: str,
                                                                        grid: bool) -> None:
    monkeypatch.setenv(gemm.BF16_ENV, value)
    route = gemm.for_bf16(gemm.Choice(True, "loss", grid=True), CPU)
    assert not route.grid and route.onednn and route.reason == "loss"
    assert route.bf16_grid is (grid and gemm.available())
    assert route.grid_dtypes == ((torch.bfloat16,) if route.bf16_grid else ())
    assert route.bf16_name == ("grid" if route.bf16_grid else "as_is")
    assert not gemm.for_bf16(gemm.Choice(False, "gpu"), torch.device("cuda")).bf16_grid
    monkeypatch.setenv(gemm.BF16_ENV, "auto")
    with pytest.raises(ConfigError, match="SEQ2SEQ_BF16_GEMM='auto': use default or grid"):
        gemm.for_bf16(gemm.DEFAULT, CPU)
