"""The fused output layer + cross-entropy equals torch's linear + cross_entropy, gradients included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seq2seq.model.loss as fused
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, PAD_ID
from seq2seq.model import build_model


def _inputs(n: int, bias: bool = True):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=gen, dtype=torch.double, requires_grad=True)
    w = torch.randn(11, 6, generator=gen, dtype=torch.double, requires_grad=True)
    b = torch.randn(11, generator=gen, dtype=torch.double, requires_grad=True) if bias else None
    y = torch.randint(0, 11, (n,), generator=gen)
    return x, w, b, y


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_linear_then_cross_entropy_across_chunks(monkeypatch, smoothing, bias):
    monkeypatch.setattr(fused, "CHUNK_ROWS", 4)  # 10 rows: chunks of 4, 4 and 2
    x, w, b, y = _inputs(10, bias)
    params = [p for p in (x, w, b) if p is not None]
    ref = F.cross_entropy(F.linear(x, w, b), y, reduction="sum", label_smoothing=smoothing)
    ref_grads = torch.autograd.grad(ref * 0.7, params)
    out = fused.linear_cross_entropy(x, w, b, y, smoothing)
    grads = torch.autograd.grad(out * 0.7, params)  # the upstream scale reaches every gradient
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the gradient-free path gives the same value
        torch.testing.assert_close(fused.linear_cross_entropy(x, w, b, y, smoothing), out)


def test_no_tokens_gives_zero_and_a_usable_graph():
    x, w, b, y = _inputs(0)
    out = fused.linear_cross_entropy(x, w, b, y)
    out.backward()
    assert float(out.detach()) == 0.0 and w.grad is not None and bool((w.grad == 0).all())


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("name", ["none", "bahdanau", "luong"])
def test_model_loss_equals_cross_entropy_of_its_logits(name, tie):
    """forward(targets=...) = cross_entropy of forward()'s logits over real tokens, with
    the same parameter gradients (dropout off)."""
    torch.manual_seed(0)
    cfg = ModelConfig(emb_size=8, hidden_size=6, tie_embeddings=tie,
                      attention=AttentionConfig(name=name))
    model = build_model(cfg, 17, 17).double().eval()  # no dropout
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(4, 17, (3, 5), generator=gen)
    lens = torch.tensor([5, 2, 4])
    src[torch.arange(5).unsqueeze(0) >= lens.unsqueeze(1)] = PAD_ID
    tgt = torch.randint(4, 17, (3, 6), generator=gen)
    tgt[1, 3:] = PAD_ID
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], dim=1)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    logits = model(src, lens, tgt_in)
    ref = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID,
                          reduction="sum", label_smoothing=0.1)
    ref_grads = grads(ref)
    out = model(src, lens, tgt_in, targets=tgt, label_smoothing=0.1)
    out_grads = grads(out)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out_grads.keys() == ref_grads.keys()
    for key in ref_grads:
        torch.testing.assert_close(out_grads[key], ref_grads[key], rtol=1e-9, atol=1e-11, msg=key)


def _fp32_inputs(n: int):
    x, w, b, y = _inputs(n)
    return (*(t.detach().float().requires_grad_() for t in (x, w, b)), y)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bf16_products_equal_the_bf16_input_path_and_stay_near_fp32(monkeypatch, smoothing):
    """Inside bf16_products an fp32 model's loss multiplies in bf16: exactly what bf16
    inputs (autocast's readout) give, within bf16 rounding of fp32, with fp32 gradients."""
    monkeypatch.setattr(fused, "CHUNK_ROWS", 4)
    x, w, b, y = _fp32_inputs(10)
    ref = fused.linear_cross_entropy(x, w, b, y, smoothing)
    ref_grads = torch.autograd.grad(ref, (x, w, b))
    xb = x.detach().bfloat16().requires_grad_()
    via_bf16_inputs = fused.linear_cross_entropy(xb, w, b, y, smoothing)
    bf16_input_grads = torch.autograd.grad(via_bf16_inputs, (xb, w, b))
    with fused.bf16_products():
        out = fused.linear_cross_entropy(x, w, b, y, smoothing)
        grads = torch.autograd.grad(out, (x, w, b))
        with torch.no_grad():
            torch.testing.assert_close(fused.linear_cross_entropy(x, w, b, y, smoothing), out)
    assert not fused._bf16  # restored
    assert out.dtype == torch.float32 and [g.dtype for g in grads] == [torch.float32] * 3
    assert torch.equal(out, via_bf16_inputs)
    for got, want in zip(grads, bf16_input_grads, strict=True):
        assert torch.equal(got, want.float())
    assert not torch.equal(out, ref)  # the products really ran in bf16
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=0)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-2 * float(want.abs().max()))


def test_bf16_products_leave_fp64_alone():
    x, w, b, y = _inputs(10)
    ref = fused.linear_cross_entropy(x, w, b, y)
    with fused.bf16_products():
        assert torch.equal(fused.linear_cross_entropy(x, w, b, y), ref)


class _ProductShapes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the (M, N) of every matrix product run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                    torch.ops.aten.addmm_.default, torch.ops.aten.mm.out,
                    torch.ops.aten.addmm.out):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("bf16", [True, False])
def test_bf16_chunks_run_at_the_full_chunk_shape_and_grads_in_two_products(monkeypatch, bf16):
    """bf16 products go to oneDNN, which builds a kernel per new shape: the last, partial
    chunk is padded with zero rows to the chunk's shape, and grad x and grad W are one
    product each over all (padded) rows after the chunk loop; the loss and gradients are
    those of the unpadded rows. fp32: three products per chunk, none padded."""
    monkeypatch.setattr(fused, "CHUNK_ROWS", 4)
    x, w, b, y = _fp32_inputs(10)  # chunks of 4, 4 and 2 rows
    ref = fused.linear_cross_entropy(x, w, b, y, 0.1)
    ref_grads = torch.autograd.grad(ref, (x, w, b))
    shapes = _ProductShapes()
    with fused.bf16_products(bf16), shapes:
        out = fused.linear_cross_entropy(x, w, b, y, 0.1)
    grads = torch.autograd.grad(out, (x, w, b))
    rows = [m for m, n in shapes.shapes if n == w.size(0)]  # logits (rows, V)
    if bf16:
        assert rows == [4, 4, 4]
        assert shapes.shapes[3:] == [(12, x.size(1)), tuple(w.shape)]  # grad x, grad W
    else:
        assert rows == [4, 4, 2] and len(shapes.shapes) == 9
    assert grads[0].shape == x.shape and grads[0].dtype == x.dtype
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(out, ref, **tol)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **tol)
