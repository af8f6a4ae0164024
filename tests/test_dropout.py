"""seq2seq/model/dropout.py: the cheaper CPU dropout mask behaves as nn.Dropout does."""

from __future__ import annotations

import pytest
import torch

from seq2seq.model.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_drops_at_rate_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    y = dropout(torch.ones(400_000), p)
    kept = y != 0
    # 400k Bernoulli draws: the standard error of the kept fraction is below 0.0008
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.004
    scale = 65536 / (65536 - round(p * 65536))
    assert torch.equal(y[kept], torch.full_like(y[kept], scale))
    assert abs(scale * (1 - p) - 1) < 1e-4  # p realised to 1/65536


def test_mask_is_not_periodic_across_the_four_lanes_of_a_draw():
    """Each 64-bit draw feeds four elements: they must be dropped independently."""
    torch.manual_seed(1)
    kept = (dropout(torch.ones(400_000), 0.5) != 0).view(-1, 4).float()
    corr = torch.corrcoef(kept.t())
    assert float((corr - torch.eye(4)).abs().max()) < 0.01
    assert 0.45 < float(kept.mean()) < 0.55


def test_gradient_is_the_mask():
    torch.manual_seed(2)
    x = torch.randn(7, 5, 3, requires_grad=True)
    y = dropout(x, 0.3)
    y.sum().backward()
    mask = torch.where(y != 0, 65536 / (65536 - round(0.3 * 65536)), 0.0)
    torch.testing.assert_close(x.grad, mask)
    torch.testing.assert_close(y, x.detach() * mask)


def test_seeded_runs_repeat_and_eval_is_identity():
    x = torch.randn(50, 20)
    torch.manual_seed(3)
    a = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.2))
    layer = Dropout(0.2).eval()
    assert layer(x) is x
    assert dropout(x, 0.0) is x
    assert bool((dropout(x, 1.0) == 0).all())  # p = 1 falls back to F.dropout


def test_shapes_dtypes_and_bad_p():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.ones(3, 7, 5, dtype=dtype)
        y = dropout(x, 0.5)
        assert y.shape == x.shape and y.dtype == dtype
    assert dropout(torch.ones(0, 4), 0.5).shape == (0, 4)
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)
