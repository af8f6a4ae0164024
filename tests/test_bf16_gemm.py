"""train.precision=bf16_gemm's large products: bf16 inputs, fp32 results, padded rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from seq2seq import precision
from seq2seq.model import bf16_gemm

BF16_REL = 4e-3  # bf16 inputs and a bf16-rounded result: ~1e-3 relative (2^-9 rounding)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.detach().bfloat16().double()


class _Products(TorchDispatchMode):
    """Records the dtype and shapes of every matrix product."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, tuple[tuple[int, ...], ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in ("mm", "addmm", "bmm"):
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            self.seen.append((name, mats[0].dtype, tuple(tuple(m.shape) for m in mats)))
        return func(*args, **(kwargs or {}))


def _linear_and_grads(x, w, b, g, on: bool):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = b.clone().requires_grad_() if b is not None else None
    with bf16_gemm.enabled(on):
        y = bf16_gemm.linear(x, w, b)
    y.backward(g)  # after the block: the backward follows the forward's decision
    return y.detach(), x.grad, w.grad, (b.grad if b is not None else None)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_the_product_of_bf16_inputs(bias: bool) -> None:
    """Values and all three gradients equal fp64 products of the bf16-rounded operands up
    to the bf16 rounding of the result; the bias and its gradient stay fp32; batch dims
    are kept; the result is fp32."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 3, 64, generator=gen), torch.randn(96, 64, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    g = torch.randn(300, 3, 96, generator=gen)
    y, gx, gw, gb = _linear_and_grads(x, w, b, g, on=True)
    assert y.shape == (300, 3, 96) and y.dtype == gx.dtype == gw.dtype == torch.float32
    exact = _rounded(x) @ _rounded(w).t() + (b.double() if bias else 0)
    assert _rel(y, exact) < BF16_REL
    assert _rel(gx, _rounded(g) @ _rounded(w)) < BF16_REL
    assert _rel(gw, _rounded(g).reshape(-1, 96).t() @ _rounded(x).reshape(-1, 64)) < BF16_REL
    if bias:
        assert torch.allclose(gb, g.sum((0, 1)), rtol=1e-5, atol=1e-4)
    # and it is really bf16: fp32 would be ~1e-7 from the fp64 product of the fp32 operands
    assert _rel(y, x.double() @ w.double().t() + (b.double() if bias else 0)) > 1e-4


def test_small_products_and_outside_the_block_stay_fp32() -> None:
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(32, 16, generator=gen), torch.randn(32, generator=gen)
    small = torch.randn(bf16_gemm.MIN_ROWS - 1, 16, generator=gen)
    large = torch.randn(bf16_gemm.MIN_ROWS, 16, generator=gen)
    with bf16_gemm.enabled():
        assert not bf16_gemm.applies(small) and bf16_gemm.applies(large)
        assert torch.equal(bf16_gemm.linear(small, w, b), F.linear(small, w, b))
        assert not bf16_gemm.applies(large.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not bf16_gemm.applies(large)  # autocast casts them itself
    assert not bf16_gemm.active() and not bf16_gemm.applies(large)
    assert torch.equal(bf16_gemm.linear(large, w, b), F.linear(large, w, b))


def test_row_counts_are_padded_so_shapes_recur() -> None:
    """Two batches of different row counts under one ROW_STEP multiple run products of
    the same shapes (oneDNN builds a kernel per new shape), all in bf16."""
    gen = torch.Generator().manual_seed(2)
    w, b = torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    shapes = []
    for rows in (bf16_gemm.MIN_ROWS + 3, bf16_gemm.MIN_ROWS + 40):
        x = torch.randn(rows, 32, generator=gen, requires_grad=True)
        with _Products() as seen, bf16_gemm.enabled():
            y = bf16_gemm.linear(x, w.requires_grad_(), b)
            y.backward(torch.ones_like(y))
        assert y.shape == (rows, 48) and x.grad.shape == (rows, 32)
        assert seen.seen and all(dtype == torch.bfloat16 for _, dtype, _ in seen.seen)
        shapes.append([s for _, _, s in seen.seen])
    assert shapes[0] == shapes[1]
    assert all(s[0][0] % bf16_gemm.ROW_STEP == 0 or s[0][1] % bf16_gemm.ROW_STEP == 0
               for s in shapes[0])


def test_weight_grads_in_bf16() -> None:
    gen = torch.Generator().manual_seed(3)
    g, x = torch.randn(600, 24, generator=gen), torch.randn(600, 40, generator=gen)
    exact = g.double().t() @ x.double()
    assert torch.allclose(bf16_gemm.weight_grad(g, x, bf16=False), exact.float(), atol=1e-3)
    got = bf16_gemm.weight_grad(g, x, bf16=True)
    assert got.dtype == torch.float32 and _rel(got, _rounded(g).t() @ _rounded(x)) < BF16_REL
    assert _rel(got, exact) > 1e-4  # really bf16
    few = bf16_gemm.weight_grad(g[:10], x[:10], bf16=True)  # too few rows: fp32
    assert torch.allclose(few, (g[:10].double().t() @ x[:10].double()).float(), atol=1e-4)
    # (D, S, B, N) and (D, S, B, K) views with any strides -> (D, N, K)
    gs, xs = torch.randn(7, 2, 90, 24, generator=gen), torch.randn(7, 2, 90, 40, generator=gen)
    batched = bf16_gemm.batched_weight_grad(gs.transpose(0, 1), xs.transpose(0, 1))
    for d in range(2):
        ref = _rounded(gs[:, d]).reshape(-1, 24).t() @ _rounded(xs[:, d]).reshape(-1, 40)
        assert _rel(batched[d], ref) < BF16_REL


def test_precision_choice_opens_the_block(monkeypatch) -> None:
    from seq2seq import runtime
    from seq2seq.model import loss

    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    choice = precision.of_name("bf16_gemm")
    assert choice.name == "bf16_gemm" and choice.loss_bf16 and not choice.bf16
    with precision.applied(choice, torch.device("cpu")):
        assert bf16_gemm.active() and loss._bf16
    with precision.applied(precision.of_name("bf16_loss"), torch.device("cpu")):
        assert not bf16_gemm.active() and loss._bf16
    assert not bf16_gemm.active()
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: False)
    with precision.applied(choice, torch.device("cpu")):
        assert not bf16_gemm.active()  # emulated bf16 is never used


@pytest.mark.parametrize("name", ["bahdanau", "luong", "none"])
def test_a_training_step_in_bf16_gemm(name: str, monkeypatch) -> None:
    """A small model's loss and gradients under bf16_gemm (every product counted large)
    are close to fp32's, and its large products did run in bf16: the encoder's input and
    weight_hh products, Bahdanau's keys, the embeddings, the readout, the loop's weight
    grads."""
    from seq2seq.config import AttentionConfig, ModelConfig
    from seq2seq.model import build_model

    monkeypatch.setattr(bf16_gemm, "MIN_ROWS", 1)
    monkeypatch.setattr(bf16_gemm, "ROW_STEP", 16)
    torch.manual_seed(0)
    model = build_model(ModelConfig(emb_size=32, hidden_size=32,
                                    attention=AttentionConfig(name=name)), 40, 40)
    src, lens = torch.randint(4, 40, (6, 9)), torch.tensor([9, 8, 8, 5, 3, 2])
    tgt = torch.randint(4, 40, (6, 8))
    grads = {}
    for on in (False, True):
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks
        with bf16_gemm.enabled(on), _Products() as seen:
            total = model(src, lens, tgt, targets=tgt)
        total.backward()
        grads[on] = (float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters()
                                    if p.grad is not None})
        bf16 = sum(dtype == torch.bfloat16 for _, dtype, _ in seen.seen)
        assert (bf16 > 0) is on
    (loss32, g32), (loss16, g16) = grads[False], grads[True]
    assert abs(loss16 - loss32) / loss32 < 1e-2
    assert g16.keys() == g32.keys()
    worst = max(g32, key=lambda n: _rel(g16[n], g32[n]))
    assert _rel(g16[worst], g32[worst]) < 5e-2, (worst, _rel(g16[worst], g32[worst]))


def test_dot_product_keys_stay_fp32(monkeypatch) -> None:
    """Luong's projected keys are multiplied into its scores by |q|; under bf16_gemm they
    stay fp32 (its seed-1 parity run read +1.9% dev loss with them in bf16), while
    Bahdanau's additive keys go to bf16."""
    from seq2seq.model.scorers import AdditiveScorer, BilinearScorer

    monkeypatch.setattr(bf16_gemm, "MIN_ROWS", 1)
    torch.manual_seed(0)
    h = torch.randn(4, 9, 32)
    dot, additive = BilinearScorer(16, 32, project=True, scale=False), AdditiveScorer(16, 32, 24)
    with bf16_gemm.enabled():
        assert torch.equal(dot.keys(h), dot.key_proj(h))
        keys = additive.keys(h)
    exact = h.double() @ additive.key_proj.weight.double().t() + additive.key_proj.bias.double()
    assert _rel(keys, exact) > 1e-4  # bf16
