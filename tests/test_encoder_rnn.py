"""The encoder's GRU loop (seq2seq/model/encoder_rnn.py) against nn.GRU: states, finals
and every gradient, both directions side by side or one, torch-op gates (fp64) and the C
kernels (fp32); the Encoder on either path; when the loop applies."""

from __future__ import annotations

import pytest
import torch
from model_helpers import one_thread  # noqa: F401  (autouse fixture)

from seq2seq import native
from seq2seq.model import encoder_rnn
from seq2seq.model.encoder import Encoder, reverse_index

needs_kernels = pytest.mark.skipif(not native.available(),
                                   reason=f"native kernels not built here: {native.status()}")
B, S, E, H = 5, 7, 6, 4
LENGTHS = torch.tensor([7, 3, 1, 5, 6])


def _rnns(dirs: int, dtype: torch.dtype, seed: int = 0) -> list[torch.nn.GRU]:
    torch.manual_seed(seed)
    return [torch.nn.GRU(E, H, batch_first=True).to(dtype) for _ in range(dirs)]


def _torch_gru(x, rnns):
    """The plain reference: nn.GRU per direction, the backward one on each sentence
    reversed within its length; states in source order and each direction's last state."""
    rev = reverse_index(LENGTHS, S).unsqueeze(-1)
    last = (LENGTHS - 1).view(-1, 1, 1).expand(-1, 1, H)
    parts, finals = [], []
    for d, rnn in enumerate(rnns):
        out, _ = rnn(x if d == 0 else x.gather(1, rev.expand_as(x)))
        finals.append(out.gather(1, last))
        parts.append(out if d == 0 else out.gather(1, rev.expand_as(out)))
    return torch.cat(parts, -1), torch.cat(finals, -1).squeeze(1)


def _loop(x, rnns, fast):
    dirs = len(rnns)
    where = encoder_rnn.Positions(LENGTHS, S, dirs, reverse_index(LENGTHS, S) if dirs == 2
                                  else None)
    return encoder_rnn.gru_layer(x, where, rnns, fast)


def _values_and_grads(fn, x, rnns, seed=1):
    states, final = fn(x, rnns)
    gen = torch.Generator().manual_seed(seed)
    up, up_final = (torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (states, final))
    mask = (torch.arange(S).unsqueeze(0) < LENGTHS.unsqueeze(1)).unsqueeze(-1)
    loss = (states * mask * up).sum() + (final * up_final).sum()  # padding states unread
    params = [x, *(p for r in rnns for p in r.parameters())]
    return (states * mask).detach(), final.detach(), torch.autograd.grad(loss, params)


def _compare(dirs, dtype, fast, **tol):
    rnns = _rnns(dirs, dtype)
    x = torch.randn(B, S, E, dtype=dtype, generator=torch.Generator().manual_seed(2))
    x.requires_grad_()
    want = _values_and_grads(_torch_gru, x, rnns)
    got = _values_and_grads(lambda x, r: _loop(x, r, fast), x, rnns)
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert len(got[2]) == 1 + 4 * dirs
    for g, w in zip(got[2], want[2], strict=True):
        assert g.abs().max() > 0
        torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("dirs", [2, 1])
def test_loop_equals_nn_gru_values_and_gradients(dirs):
    """torch-op gates in fp64: states, finals and the gradients of the input and of all
    four weights of each direction."""
    _compare(dirs, torch.float64, False)


@needs_kernels
@pytest.mark.parametrize("dirs", [2, 1])
def test_loop_with_the_kernels_equals_nn_gru_in_fp32(dirs):
    _compare(dirs, torch.float32, True, rtol=1e-5, atol=1e-5)


def _encoder(layers=2, bidirectional=True, rnn_type="gru"):
    torch.manual_seed(0)
    return Encoder(20, E, H, layers=layers, rnn_type=rnn_type,
                   bidirectional=bidirectional).double()


def _encode(enc):
    src = torch.randint(4, 20, (B, S), generator=torch.Generator().manual_seed(3))
    mask = torch.arange(S).unsqueeze(0) < LENGTHS.unsqueeze(1)
    src = src.masked_fill(~mask, 0)
    states, final = enc(src, LENGTHS, mask)
    loss = (states * torch.linspace(-1, 1, states.numel()).view_as(states).double()).sum() \
        + final.pow(2).sum()
    return states.detach(), final.detach(), torch.autograd.grad(loss, list(enc.parameters()))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_encoder_gives_the_same_on_either_path(monkeypatch, bidirectional):
    """Two layers: the loop and nn.GRU agree on states (zero at padding), finals and the
    gradients of every parameter, embeddings included."""
    enc = _encoder(bidirectional=bidirectional)
    results = {}
    for use in (True, False):
        monkeypatch.setattr(encoder_rnn, "applies", lambda x, rnns, use=use: use)
        results[use] = _encode(enc)
    (s1, f1, g1), (s0, f0, g0) = results[True], results[False]
    torch.testing.assert_close(s1, s0)
    torch.testing.assert_close(f1, f0)
    assert (s1[~(torch.arange(S).unsqueeze(0) < LENGTHS.unsqueeze(1))] == 0).all()
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b)


def test_the_loop_applies_only_to_one_layer_grus_on_the_cpu_outside_autocast(monkeypatch):
    monkeypatch.setattr(native, "choose", lambda name, trial, margin=1.0: True)
    x = torch.randn(2, 3, E)
    gru, lstm = _rnns(2, torch.float32), [torch.nn.LSTM(E, H, batch_first=True)]
    assert encoder_rnn.applies(x, gru)
    assert not encoder_rnn.applies(x, lstm)
    assert not encoder_rnn.applies(x, [torch.nn.GRU(E, H, num_layers=2, batch_first=True)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not encoder_rnn.applies(x, gru)
    monkeypatch.setattr(native, "choose", lambda name, trial, margin=1.0: False)
    assert not encoder_rnn.applies(x, gru)


@needs_kernels
def test_the_choice_is_timed_once_and_works_in_inference_mode(monkeypatch):
    """Decoding may encode first, under inference_mode: the timing (forward and backward
    on its own tensors) must still run, and is kept for the next call."""
    monkeypatch.setattr(native, "_chosen", {})
    enc = _encoder().float()
    src = torch.randint(4, 20, (B, S))
    mask = torch.arange(S).unsqueeze(0) < LENGTHS.unsqueeze(1)
    rng = torch.random.get_rng_state()
    with torch.inference_mode():
        states, _ = enc(src.masked_fill(~mask, 0), LENGTHS, mask)
    assert f"encoder GRU loop {E}->{H} x2 on 1 thread" in native._chosen
    assert torch.equal(torch.random.get_rng_state(), rng), "the timing drew from torch's RNG"
    assert states.shape == (B, S, 2 * H)
    chosen = dict(native._chosen)
    enc(src.masked_fill(~mask, 0), LENGTHS, mask)
    assert native._chosen == chosen


def test_lstm_encoders_keep_nn_lstm(monkeypatch):
    """An LSTM never reaches the loop, even where the timing would choose it."""
    monkeypatch.setattr(native, "choose", lambda name, trial, margin=1.0: True)
    called = []
    monkeypatch.setattr(encoder_rnn, "gru_layer", lambda *a: called.append(1))
    _encode(_encoder(rnn_type="lstm"))
    assert not called
