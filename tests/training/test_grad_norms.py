"""Clipping that keeps each gradient's norm: the same clipping as torch's, and the names of non-finite ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from usmkit.training.grad_norms import clip_with_norms, describe_non_finite


def _model_with_grads(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), nn.Linear(3, 2))
    model[3].requires_grad_(False)  # parameters without a gradient are left out
    model(torch.randn(5, 4)).pow(2).sum().mul(50).backward()
    return model


@pytest.mark.parametrize("max_norm", [0.1, float("inf")])
def test_clipping_equals_torchs(max_norm):
    ours, theirs = _model_with_grads(0), _model_with_grads(0)
    total, norms, names = clip_with_norms(list(ours.named_parameters()), max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    torch.testing.assert_close(total, expected)
    assert names == ("0.weight", "0.bias", "2.weight", "2.bias") and norms.shape == (4,)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad)
    if max_norm < float("inf"):
        grads = [p.grad for p in ours.parameters() if p.grad is not None]
        assert float(torch.nn.utils.get_total_norm(grads)) == pytest.approx(max_norm, rel=1e-5)


def test_non_finite_gradients_are_named():
    model = _model_with_grads(1)
    model[2].bias.grad[0] = float("nan")
    _, norms, names = clip_with_norms(list(model.named_parameters()), 1.0)
    assert describe_non_finite(names, norms.tolist()) == "2.bias of 4 (norms: 1 NaN, 0 inf)"
    assert describe_non_finite(names, [1.0] * 4) == ""
    many = tuple(f"p{i}" for i in range(6))
    nan, inf = float("nan"), float("inf")
    assert (
        describe_non_finite(many, [nan, inf, inf, nan, inf, 2.0]) == "p0, p1, p2 and 2 more of 6 (norms: 2 NaN, 3 inf)"
    )
    model = _model_with_grads(1)  # (the NaN total made the clipping above turn every gradient NaN)
    model[0].weight.grad[0, 0] = 1e20  # finite, but its square overflows the fp32 norm: counted as inf
    _, norms, names = clip_with_norms(list(model.named_parameters()), float("inf"))
    assert describe_non_finite(names, norms.tolist()) == "0.weight of 4 (norms: 0 NaN, 1 inf)"
    with pytest.raises(ValueError, match="no parameter"):
        clip_with_norms([("w", nn.Parameter(torch.ones(2)))], 1.0)
