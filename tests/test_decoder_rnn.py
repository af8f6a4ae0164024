"""The decoder RNN of the teacher-forced step loop (seq2seq/model/decoder_rnn.py) against
torch's cells: the GRU gates (torch ops and the C kernels), the weights' gradients formed
once after the loop (LoopLinear; the input-feeding readout's too), bf16 autocast, and
that no batch outlives its step."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from model_helpers import one_thread  # noqa: F401  (autouse fixture)

from seq2seq import native
from seq2seq.model import decoder_rnn
from seq2seq.model.decoder_rnn import LoopRNN, StackedRNN, pack_steps
from seq2seq.model.gru_gates import _GRUGates, gru_gates

needs_kernels = pytest.mark.skipif(not native.available(),
                                   reason=f"native kernels not built here: {native.status()}")
E, C, H = 5, 6, 4  # embedding, other input parts (context) and hidden sizes


def _cell_inputs(dtype=torch.float64, rows=7, hidden=H, width=E, seed=0):
    """x (rows, width), h (rows, hidden) and a GRU's weights, all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((rows, width), (rows, hidden), (3 * hidden, width), (3 * hidden, hidden),
              (3 * hidden,), (3 * hidden,))
    return [torch.randn(*s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _through_gates(fast: bool, x, h, w_ih, w_hh, b_ih, b_hh):
    return _GRUGates.apply(F.linear(x, w_ih, b_ih), F.linear(h, w_hh, b_hh), h, fast)


def _values_and_grads(fn, inputs, seed=1):
    out = fn(*inputs)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return out.detach(), torch.autograd.grad(out, inputs, up)


def test_gru_gates_equal_torch_gru_cell_values_and_gradients():
    """The written-out backward (torch ops) against autograd through torch.gru_cell, fp64."""
    inputs = _cell_inputs()
    want, want_grads = _values_and_grads(torch.gru_cell, inputs)
    got, got_grads = _values_and_grads(lambda *a: _through_gates(False, *a), inputs)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@needs_kernels
def test_gru_gates_kernel_equals_torch_cell_in_fp32():
    """The C kernels (forward and backward) against torch.gru_cell in fp32, at the
    benchmark's size and with large pre-activations (saturated gates)."""
    for scale, seed in ((1.0, 0), (6.0, 1)):
        inputs = [(t.detach() * scale).requires_grad_()
                  for t in _cell_inputs(torch.float32, rows=33, hidden=256, width=300, seed=seed)]
        want, want_grads = _values_and_grads(torch.gru_cell, inputs)
        got, got_grads = _values_and_grads(lambda *a: _through_gates(True, *a), inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))


@needs_kernels
def test_gru_gates_take_the_path_the_choice_names(monkeypatch):
    """fp32 CPU tensors go to the kernels when the timing chose them, else to torch ops;
    fp64 never goes to the kernels."""
    calls = []
    kernel = native.gru_gates
    monkeypatch.setattr(native, "gru_gates", lambda *a: calls.append(1) or kernel(*a))
    gi, gh, h = (torch.randn(3, n) for n in (12, 12, 4))
    for faster, expected in ((True, 1), (False, 0)):
        calls.clear()
        monkeypatch.setattr(native, "_chosen",
                            {"gru_gates with gradients on 1 thread": (faster, "a timing")})
        gru_gates(gi, gh, h)
        assert len(calls) == expected
        calls.clear()
        gru_gates(gi.double(), gh.double(), h.double())
        assert not calls
    with native.disabled():
        monkeypatch.setattr(native, "_chosen",
                            {"gru_gates with gradients on 1 thread": (True, "a timing")})
        gru_gates(gi, gh, h)
        assert not calls


def _loop(rnn: StackedRNN, emb, rest, rows, use_loop: bool):
    """Run the step loop over emb (B, T, E) and rest (B, T, C), step t on rows[t] rows;
    the top layer's states of every step, packed time-major."""
    batch = emb.size(0)
    hidden = tuple(torch.zeros(batch, H, dtype=emb.dtype) + 0.1 * (i + 1)
                   for i in range(rnn.layers))
    cell = tuple(torch.zeros(batch, H, dtype=emb.dtype) for _ in range(rnn.layers)) \
        if rnn.is_lstm else None
    loop = LoopRNN(rnn, pack_steps(emb, rows), rows) if use_loop else None
    out = []
    for t, n in enumerate(rows):
        hidden = tuple(s[:n] for s in hidden)
        cell = None if cell is None else tuple(c[:n] for c in cell)
        if loop is None:
            hidden, cell = rnn.step(torch.cat([emb[:n, t], rest[:n, t]], 1), hidden, cell)
        else:
            hidden, cell = loop.step([rest[:n, t]], hidden, cell)
        out.append(hidden[-1])
    return torch.cat(out)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_loop_rnn_equals_the_plain_steps_with_all_gradients(rnn_type, layers):
    """Rows shrinking step by step (the packed loop): every state and every gradient, of
    the parameters, the embeddings and the other parts, as torch's cells give them."""
    torch.manual_seed(0)
    rnn = StackedRNN(rnn_type, E + C, H, layers, dropout=0.0).double()
    emb = torch.randn(5, 4, E, dtype=torch.double, requires_grad=True)
    rest = torch.randn(5, 4, C, dtype=torch.double, requires_grad=True)
    rows = [5, 4, 4, 2]
    params = [emb, rest, *rnn.parameters()]
    up = torch.randn(sum(rows), H, dtype=torch.double)
    results = []
    for use_loop in (False, True):
        out = _loop(rnn, emb, rest, rows, use_loop)
        results.append((out.detach(), torch.autograd.grad(out, params, up)))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_loop_rnn_under_bf16_autocast_stays_near_fp32():
    """Under CPU bf16 autocast the products run in bf16 (weights cast once per loop) and
    the result stays within bf16 rounding of fp32, gradients included."""
    torch.manual_seed(0)
    rnn = StackedRNN("gru", E + C, H, 1, dropout=0.0)
    emb = torch.randn(5, 4, E, requires_grad=True)
    rest = torch.randn(5, 4, C, requires_grad=True)
    rows, params = [5, 5, 3, 3], [emb, rest, *rnn.parameters()]
    want = _loop(rnn, emb, rest, rows, use_loop=False)
    want_grads = torch.autograd.grad(want.sum(), params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _loop(rnn, emb, rest, rows, use_loop=True)
    got_grads = torch.autograd.grad(got.float().sum(), params)
    assert not torch.equal(got.float(), want)  # the products really ran in bf16
    torch.testing.assert_close(got.float(), want, rtol=0, atol=3e-2)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=5e-2 * float(w.abs().max()))


def test_loop_rnn_refuses_a_loop_with_nothing_but_the_embeddings():
    rnn = StackedRNN("gru", E, H, 1, dropout=0.0)
    with pytest.raises(ValueError, match="fused"):
        LoopRNN(rnn, torch.randn(6, E), [2, 2, 2])


def test_a_loop_leaves_nothing_alive(monkeypatch):
    """The weights' gradient anchors must not tie the batch's graph into a reference
    cycle through autograd's C++ nodes (see _Deferred in seq2seq/model/deferred.py)."""
    made = []

    class Tracked(decoder_rnn.LoopLinear):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    monkeypatch.setattr(decoder_rnn, "LoopLinear", Tracked)
    rnn = StackedRNN("gru", E + C, H, 2, dropout=0.0)
    emb, rest = torch.randn(4, 3, E, requires_grad=True), torch.randn(4, 3, C)
    out = _loop(rnn, emb, rest, [4, 3, 1], use_loop=True)
    out.sum().backward()
    del out
    gc.collect()
    assert len(made) == 4  # layer 0 input, layer 1 input, two recurrent
    assert all(ref() is None for ref in made)


@needs_kernels
def test_the_gates_choice_can_be_made_without_grad_mode(monkeypatch):
    """A run's first loop may be a validation under no_grad: the timing still works."""
    monkeypatch.setattr(native, "_chosen", {})
    gi, gh, h = (torch.randn(3, n) for n in (12, 12, 4))
    with torch.no_grad():
        out = gru_gates(gi, gh, h)
    assert "gru_gates with gradients on 1 thread" in native._chosen
    torch.testing.assert_close(out, _GRUGates.apply(gi, gh, h, False), rtol=1e-5, atol=1e-6)


def test_input_feeding_readout_forms_its_weight_gradient_once():
    """Luong's readout runs at every step of the loop (input feeding); its weight's
    gradient is one product after the loop (Readout.in_loop), not one per step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from seq2seq.config import AttentionConfig, ModelConfig
    from seq2seq.constants import BOS_ID
    from seq2seq.model import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(emb_size=8, hidden_size=5, attention=AttentionConfig(name="luong"))
    model = build_model(cfg, 17, 17)
    shape = model.decoder.readout.proj.weight.shape  # (5, 15): no other weight has it
    gen = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(4, 17, (3, n), generator=gen) for n in (7, 6))
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], dim=1)

    class Products(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm) \
                    and out.shape == shape:
                Products.count += 1
            return out

    loss = model(src, torch.tensor([7, 7, 7]), tgt_in, targets=tgt)
    with Products():
        loss.backward()
    assert model.decoder.attention.feeds_input and Products.count == 1
    assert model.decoder.readout.proj.weight.grad is not None
