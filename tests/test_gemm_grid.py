"""seq2seq.model.gemm_grid: products padded onto a grid of shapes equal torch's own, forward
and backward, keep the set of shapes small, and hand torch's kernels back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.model import gemm, gemm_grid

pytestmark = pytest.mark.skipif(not gemm.available(), reason="this torch has no oneDNN matmul route")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def test_the_grid_rounds_up_by_at_most_an_eighth_and_keeps_model_sizes() -> None:
    for d in range(1, gemm_grid.LIMIT + 1):
        g = gemm_grid.grid(d)
        assert d <= g and gemm_grid.grid(g) == g
        assert g - d < 16 if d <= 64 else g <= d * 1.125
    assert [gemm_grid.grid(d) for d in (1, 17, 64, 65, 256, 512, 768, 1024, 3000)] == \
        [16, 32, 64, 72, 256, 512, 768, 1024, 3072]
    sides = {gemm_grid.grid(d) for d in range(1, gemm_grid.LIMIT + 1)}
    assert len(sides) == 52  # so a weight meets at most 52 row counts


@pytest.mark.parametrize("m, k, n", [(37, 768, 768), (1, 5, 16), (61, 256, 768), (200, 70, 256),
                                     (3, 5, 7), (100, 256, 8000)])
def test_mm_and_addmm_equal_a_float64_product(m: int, k: int, n: int,
                                              onednn_rel_error: float) -> None:
    gen = torch.Generator().manual_seed(m + k + n)
    a, b = torch.randn(m, k, generator=gen, dtype=torch.float64), torch.randn(k, n, generator=gen, dtype=torch.float64)
    bias = torch.randn(n, generator=gen, dtype=torch.float64)
    for bb in (b.float(), b.float().t().contiguous().t()):  # a weight is often a transposed view
        got = gemm_grid.mm(a.float(), bb)
        assert got.shape == (m, n) and got.is_contiguous()
        assert _rel(got, a @ b) < onednn_rel_error
        got = gemm_grid.addmm(bias.float(), a.float(), bb, beta=0.5, alpha=2.0)
        assert got.shape == (m, n) and _rel(got, 0.5 * bias + 2.0 * (a @ b)) < onednn_rel_error
    got = gemm_grid.mm(a.float().t().contiguous().t(), b.float())  # a transposed left side
    assert _rel(got, a @ b) < onednn_rel_error


def test_off_grid_outputs_other_dtypes_and_large_sides_run_as_they_are() -> None:
    start = dict(gemm_grid.calls)
    gemm_grid.mm(torch.randn(5, 8), torch.randn(8, 7))  # 7 output columns: off the grid
    gemm_grid.mm(torch.randn(5, 8, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64))
    gemm_grid.mm(torch.randn(gemm_grid.LIMIT + 1, 8), torch.randn(8, 16))
    gemm_grid.addmm(torch.randn(5, 16), torch.randn(5, 8), torch.randn(8, 16))  # a 2-d bias
    assert gemm_grid.calls["as_is"] == start["as_is"] + 4 and gemm_grid.calls["grid"] == start["grid"]
    gemm_grid.mm(torch.randn(5, 8), torch.randn(8, 16))
    assert gemm_grid.calls["grid"] == start["grid"] + 1


def test_a_layer_trains_the_same_on_the_grid(onednn_rel_error: float) -> None:
    """Forward and every gradient of linear -> tanh -> linear (autograd's backward
    products go through the grid as well) equal the float64 computation to fp32
    accuracy. On a CPU where oneDNN's "fp32" products take bf16 inputs, a product's
    error passes on through the saturated tanh's gradient, so there the reference is the
    same layer with every product through oneDNN unpadded: the grid's padding may change
    only the rounding of the two products it leaves to MKL."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(45, 70, generator=gen, dtype=torch.float64)
    w1, b1 = torch.randn(256, 70, generator=gen, dtype=torch.float64), torch.randn(256, generator=gen, dtype=torch.float64)
    w2 = torch.randn(48, 256, generator=gen, dtype=torch.float64)

    def run(dtype: torch.dtype) -> list[torch.Tensor]:
        leaves = [t.to(dtype).clone().requires_grad_() for t in (x, w1, b1, w2)]
        out = F.linear(torch.tanh(F.linear(leaves[0], leaves[1], leaves[2])), leaves[3])
        (out ** 2).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    if onednn_rel_error > gemm.MAX_REL_ERROR:  # oneDNN's route rounds inputs on this CPU
        with gemm_grid.flag(True):
            want = run(torch.float32)
    else:
        want = run(torch.float64)
    start = dict(gemm_grid.calls)
    with gemm_grid.on_grid():
        got = run(torch.float32)
    # on the grid: both forward products, grad w2 and the hidden layer's grad; as they
    # are: grad w1 and grad x, whose 70 output columns are off the grid
    assert gemm_grid.calls["grid"] == start["grid"] + 4
    assert gemm_grid.calls["as_is"] == start["as_is"] + 2
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < onednn_rel_error


def test_on_grid_gives_torchs_kernels_back_even_after_an_error() -> None:
    a, b = torch.randn(9, 32), torch.randn(32, 16)
    with pytest.raises(RuntimeError, match="boom"), gemm_grid.on_grid():
        start = gemm_grid.calls["grid"]
        torch.mm(a, b)
        assert gemm_grid.calls["grid"] == start + 1
        raise RuntimeError("boom")
    start = gemm_grid.calls["grid"]
    torch.mm(a, b), torch.addmm(torch.zeros(16), a, b), F.linear(a, b.t())
    assert gemm_grid.calls["grid"] == start
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"


def test_bf16_products_take_the_grid_only_where_accepted_and_equal_torchs() -> None:
    """bf16 products padded onto the grid equal torch's bf16 product of the same inputs
    (both accumulate in fp32, so they differ by the output's bf16 rounding at most)."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(61, 256, generator=gen).bfloat16(), torch.randn(256, 768, generator=gen).bfloat16()
    bias = torch.randn(768, generator=gen).bfloat16()
    want = a.double() @ b.double()
    start = dict(gemm_grid.calls)
    gemm_grid.mm(a, b)  # fp32 only outside a block
    assert gemm_grid.calls["as_is"] == start["as_is"] + 1 and gemm_grid.calls["grid"] == start["grid"]
    with gemm_grid.accepting((torch.bfloat16,)):
        got = gemm_grid.mm(a, b)
        got_add = gemm_grid.addmm(bias, a, b)
        gemm_grid.mm(a.float(), b.float())  # and so does fp32, not accepted here
    assert gemm_grid.calls["grid"] == start["grid"] + 2
    assert gemm_grid.calls["as_is"] == start["as_is"] + 2
    assert got.dtype == torch.bfloat16 and got.shape == (61, 768)
    plain = torch.mm(a, b).double()
    assert _rel(got, want) < 1e-2 and _rel(got, plain) < 1e-2
    assert _rel(got_add, want + bias.double()) < 1e-2
    assert gemm_grid._accepted == (torch.float32,)  # the setting is restored


def test_on_grid_routes_bf16_autocast_products_of_a_layer() -> None:
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(45, 64, generator=gen), torch.randn(256, 64, generator=gen, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.linear(x, w)
    start = gemm_grid.calls["grid"]
    with gemm_grid.on_grid((torch.bfloat16,)), torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.linear(x, w)
        got.float().sum().backward()  # grad w: (256, 45) @ (45, 64), on the grid too
    assert gemm_grid.calls["grid"] == start + 2
    assert got.dtype == torch.bfloat16 and _rel(got, want.double()) < 1e-2
    assert _rel(w.grad, x.sum(0).double().expand(256, 64)) < 1e-2
