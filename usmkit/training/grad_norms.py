"""Gradient clipping that keeps each gradient's norm, so a non-finite step can name its parameters.

``torch.nn.utils.clip_grad_norm_`` computes every gradient's norm and returns only their total; the
trainer learns that a step was non-finite a step later, when the gradients are gone. Keeping the
(P,) per-gradient norms on the device costs no synchronization and names the culprits then.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def clip_with_norms(
    named: list[tuple[str, nn.Parameter]], max_norm: float
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Clip the gradients of ``named`` as ``clip_grad_norm_(max_norm)`` does (``inf`` only measures).

    Returns the total L2 norm (a 0-d tensor), each gradient's norm (P,) fp32 and their parameters' names
    (parameters without a gradient this step are left out). Everything stays on the device.
    """
    params = [(name, p) for name, p in named if p.grad is not None]
    if not params:
        raise ValueError("clip_with_norms: no parameter has a gradient")
    # torch._foreach_norm is what clip_grad_norm_ itself uses: one kernel per device and dtype. stack
    # promotes mixed dtypes, so no per-norm cast on the host.
    norms = torch.stack(torch._foreach_norm([p.grad for _, p in params])).float()  # (P,)
    total = torch.linalg.vector_norm(norms)
    torch.nn.utils.clip_grads_with_norm_([p for _, p in params], max_norm, total, foreach=True)
    return total, norms, tuple(name for name, _ in params)


def describe_non_finite(names: tuple[str, ...], norms: list[float], limit: int = 3) -> str:
    """'a, b, c and 4 more of 120 (norms: 5 NaN, 2 inf)' for the names whose gradient norm is not finite; ''
    when all are. A NaN norm means NaN values; an inf norm means inf values or finite ones whose squares
    overflow the fp32 norm (above ~1e19)."""
    bad = [(name, norm) for name, norm in zip(names, norms, strict=True) if not math.isfinite(norm)]
    if not bad:
        return ""
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    nan = sum(math.isnan(norm) for _, norm in bad)
    return (
        f"{', '.join(name for name, _ in bad[:limit])}{more} of {len(names)} (norms: {nan} NaN, {len(bad) - nan} inf)"
    )
