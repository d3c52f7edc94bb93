"""Eager chunk-wise attention: the oracle every fast implementation is tested against.

Shapes: B batch, H heads, T frames, D head dim. q, k, v: (B, H, T, D); lengths: (B,) int, or the
``Segments`` of packed rows. Mask semantics: ``usmkit.kernels.masks``.
"""

from __future__ import annotations

import math

import torch

from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.kernels.masks import Frames, frames_mask


def chunk_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: Frames,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
    bias: RelativeKeyBias | None = None,
) -> torch.Tensor:
    """Plain matmul + softmax under the chunk mask, plus ``bias`` where given; rows of padded queries are 0.
    Returns (B, H, T, D)."""
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    mask = frames_mask(lengths, T, chunk_size, left_chunks)[:, None]  # (B, 1, T, T)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, T, T)
    if bias is not None:
        scores = scores + bias.dense(T)
    scores = scores.masked_fill(~mask, float("-inf"))
    any_key = mask.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
    # A fully masked row would be softmax(-inf...) = NaN; give it finite scores, then zero it.
    probs = torch.softmax(scores.masked_fill(~any_key, 0.0), dim=-1) * any_key
    return torch.matmul(probs, v)  # (B, H, T, D)
