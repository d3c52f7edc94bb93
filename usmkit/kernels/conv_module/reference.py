"""The Conformer convolution module's middle, in plain PyTorch: the oracle of the fused Triton kernel.

Shapes: B batch, T frames, D channels, K depthwise kernel taps.

h (B, T, 2D), the first pointwise projection's output -> GLU -> zero the frames that are not ``valid`` ->
depthwise convolution over time (tap k reads frame t + k - left; taps outside the row, or, with ``ids``,
onto a frame of another utterance, read zero) + bias -> LayerNorm over D -> Swish -> (B, T, D) in h's dtype.
The same arithmetic as ``usmkit.models.convolution.ConvolutionModule``'s ``pointwise_in``, ``depthwise`` and
the start of ``pointwise_out``, computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_mid_reference(
    h: torch.Tensor,
    valid: torch.Tensor,
    ids: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    left: int,
) -> torch.Tensor:
    """h (B, T, 2D), valid (B, T) bool, ids (B, T) utterance ids of packed rows or None (one utterance per
    row), weight (D, K), bias (D,), ln_weight / ln_bias (D,) -> (B, T, D) in h's dtype."""
    B, T, D2 = h.shape
    D, K = weight.shape
    y = F.glu(h.float(), dim=-1) * valid[:, :, None]  # (B, T, D)
    right = K - 1 - left
    seq = F.pad(y, (0, 0, left, right))  # (B, T + K - 1, D)
    seq_ids = F.pad(ids, (left, right), value=-1) if ids is not None else None  # (B, T + K - 1)
    z = torch.zeros(B, T, D, dtype=torch.float32, device=h.device)
    for k in range(K):
        term = seq[:, k : k + T] * weight[:, k].float()  # (B, T, D)
        if ids is not None:
            term = term * (seq_ids[:, k : k + T] == ids)[:, :, None]
        z = z + term
    z = z + bias.float()
    out = F.silu(F.layer_norm(z, (D,), ln_weight.float(), ln_bias.float(), eps))
    return out.to(h.dtype)
