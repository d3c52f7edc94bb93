"""The CPU-cheap dropout (usmkit.models.dropout) against what dropout must be."""

from __future__ import annotations

import pytest
import torch

from usmkit.models.dropout import Dropout, byte_threshold, keep_mask


def test_mask_bytes_are_uniform_and_the_keep_rate_is_exact():
    torch.manual_seed(0)
    n = 7 * 100_000
    mask = keep_mask((n,), 26)
    assert mask.dtype == torch.bool and mask.shape == (n,)
    assert abs(mask.float().mean().item() - (1 - 26 / 256)) < 3e-3
    # Every one of the 7 byte positions drawn per 64-bit word is uniform over 0..255 (chi-square test).
    words = torch.empty(200_000, dtype=torch.int64).random_()
    random_bytes = words.view(torch.uint8).view(-1, 8)[:, :7]
    expected = words.shape[0] / 256
    for position in range(7):
        counts = torch.bincount(random_bytes[:, position].long(), minlength=256).double()
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 340, (position, chi2)  # 255 degrees of freedom: p ~ 1e-3 at 340
    # Masks of neighbouring elements are not correlated.
    m = keep_mask((n,), 128).float()
    assert abs(torch.corrcoef(torch.stack([m[:-1], m[1:]]))[0, 1].item()) < 0.01


def test_dropout_zeroes_and_rescales_and_its_gradient_is_the_mask():
    drop = Dropout(0.1).train()
    x = torch.randn(8, 50, 64, requires_grad=True)
    torch.manual_seed(1)
    y = drop(x)
    kept = y != 0
    scale = 256 / (256 - byte_threshold(0.1))
    torch.testing.assert_close(y[kept], x[kept] * scale)
    assert abs(kept.float().mean().item() - (1 - 26 / 256)) < 0.01
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * scale)
    # Seeded: the same mask again; eval mode and p=0 pass through.
    torch.manual_seed(1)
    assert torch.equal(drop(x.detach()), y.detach())
    assert drop.eval()(x) is x and Dropout(0.0).train()(x) is x


def test_dropout_matches_nn_dropout_in_expectation():
    torch.manual_seed(2)
    x = torch.ones(400, 1000)
    ours, theirs = Dropout(0.3).train()(x), torch.nn.Dropout(0.3).train()(x)
    assert abs(ours.mean().item() - 1.0) < 0.01 and abs(theirs.mean().item() - 1.0) < 0.01
    assert abs((ours == 0).float().mean().item() - round(0.3 * 256) / 256) < 0.005
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
