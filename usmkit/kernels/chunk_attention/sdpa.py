"""Chunk-wise attention through ``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask.

Shapes: B batch, H heads, T frames, D head dim. q, k, v: (B, H, T, D); lengths: (B,) int, or the
``Segments`` of packed rows. Mask semantics: ``usmkit.kernels.masks`` (the same as ``reference.py``, which this is tested against).

SDPA returns NaN for a query row whose mask is all False (padded queries). So each padded query row
is allowed to see key 0, which keeps every softmax finite, and its output is set to 0 afterwards;
the zeroed rows pass no gradient back to q, k or v. On CUDA a dense mask selects the
memory-efficient (or math) backend, not flash.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.kernels.masks import Frames, frames_mask, frames_padding


def chunk_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: Frames,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
    bias: RelativeKeyBias | None = None,
) -> torch.Tensor:
    """SDPA under the chunk mask; rows of padded queries are 0. Returns (B, H, T, D).

    With ``bias`` the mask becomes a float one: the bias where allowed, -inf elsewhere."""
    B, H, T, D = q.shape
    mask = frames_mask(lengths, T, chunk_size, left_chunks)  # (B, T, T)
    padded = frames_padding(lengths, T)  # (B, T), True at padded frames
    first_key = torch.arange(T, device=q.device) == 0  # (T,)
    mask = mask | (padded[:, :, None] & first_key[None, None, :])  # (B, T, T): padded rows see key 0
    attn_mask = mask[:, None]  # (B, 1, T, T)
    if bias is not None:
        attn_mask = bias.dense(T).to(q.dtype).masked_fill(~attn_mask, float("-inf"))  # (B, H, T, T)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)  # (B, H, T, D)
    return out.masked_fill(padded[:, None, :, None], 0.0)  # (B, H, T, D)
