"""The C kernels' rows split in blocks over torch's threads (kernels.c): every
row computed once, by the same code, so the split results equal one thread's; the
sums over rows (gradients of v and of the bias) within fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from seq2seq import native
from seq2seq.model.scorers import additive_scores

needs_kernels = pytest.mark.skipif(not native.available(),
                                   reason=f"native kernels not built here: {native.status()}")


@pytest.fixture
def threads():
    """Run a block at a given torch thread count, restoring the one found."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_one_block_per_thread_each_of_at_least_min_block_elements(threads):
    threads(3)
    assert native.blocks(96, 35 * 256) == 3
    assert native.blocks(10, native.MIN_BLOCK // 4) == 2  # 3 blocks would be under MIN_BLOCK
    assert native.blocks(2, 100) == 1 and native.blocks(0, 100) == 1
    threads(1)
    assert native.blocks(10_000, 10_000) == 1


def _both(fn, threads):
    """fn() on 1 torch thread and on 2 (split in two blocks)."""
    threads(1)
    one = fn()
    threads(2)
    return one, fn()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_scores_equal_one_threads(threads, dtype):
    gen = torch.Generator().manual_seed(0)
    q2 = torch.randn(64, 3, 128, generator=gen).to(dtype)  # 64 x 3 x 40 x 128: two blocks
    keys = torch.randn(64, 40, 128, generator=gen).to(dtype)
    v = torch.randn(1, 128, generator=gen)
    threads(2)
    assert native.blocks(64, 3 * 40 * 128) == 2
    one, two = _both(lambda: native.additive_scores(q2, keys, v), threads)
    assert torch.equal(one, two)


@needs_kernels
@pytest.mark.parametrize("into", [False, True])
def test_split_score_gradients_equal_one_threads(threads, into):
    gen = torch.Generator().manual_seed(1)
    q2, keys = torch.randn(96, 256, generator=gen), torch.randn(96, 35, 256, generator=gen)
    v, up = torch.randn(1, 256, generator=gen), torch.randn(96, 35, generator=gen)
    start = torch.randn(96, 35, 256, generator=gen)

    def grads():
        buffer = start.clone() if into else None
        q, k, w = native.additive_scores_backward(q2, keys, v, up, buffer)
        return q, (buffer if into else k), w

    one, two = _both(grads, threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert not torch.equal(one[1], start)  # added into, not skipped
    # v's gradient sums 96 x 35 terms: summed in two blocks it rounds differently, and is
    # as close to the fp64 gradient as one thread's sum
    wide = [t.double().requires_grad_() for t in (q2, keys, v)]
    want = torch.autograd.grad(additive_scores(*wide), wide, up.double())[2].float()
    scale = float(want.abs().max())
    assert (two[2] - want).abs().max() <= max(2 * (one[2] - want).abs().max(), 1e-6 * scale)


@needs_kernels
@pytest.mark.parametrize("grad_dtype", [None, torch.float32, torch.bfloat16])
def test_split_loss_rows_equal_one_threads(threads, grad_dtype):
    gen = torch.Generator().manual_seed(2)
    logits = 4 * torch.randn(300, 8000, generator=gen)
    target = torch.randint(0, 8000, (300,), generator=gen)

    def rows():
        bias = torch.ones(8000)
        loss, grad = native.cross_entropy_rows(logits, target, 0.1, grad_dtype, bias)
        return loss, grad, bias

    one, two = _both(rows, threads)
    torch.testing.assert_close(two[0], one[0], rtol=1e-6, atol=0)
    if grad_dtype is None:
        assert one[1] is None and two[1] is None and torch.equal(two[2], torch.ones(8000))
        return
    assert torch.equal(one[1], two[1])
    torch.testing.assert_close(two[2], one[2], rtol=1e-5, atol=1e-5)
    assert not torch.equal(two[2], torch.ones(8000))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_top_k_equals_one_threads(threads, dtype):
    gen = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(40, 8000, generator=gen)).to(dtype)
    threads(2)
    assert native.blocks(40, 8000) == 2
    one, two = _both(lambda: native.vocab_topk(logits, 5, skip=(0, 2)), threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@needs_kernels
def test_split_gru_gates_equal_one_threads(threads):
    gen = torch.Generator().manual_seed(4)
    rows, width = 192, 256  # two blocks of 96 rows x 3 x 256
    gi, gh = torch.randn(rows, 3 * width, generator=gen), torch.randn(rows, 3 * width, generator=gen)
    h, grad = torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen)
    threads(2)
    assert native.blocks(rows, 3 * width) == 2

    def both_ways():
        out, keep = native.gru_gates(gi, gh, h)
        return (out, keep, *native.gru_gates_backward(grad, keep, gh, h))

    one, two = _both(both_ways, threads)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)
