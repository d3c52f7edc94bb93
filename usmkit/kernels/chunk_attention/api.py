"""Public entry point for chunk-wise attention: one signature, several implementations.

Shapes: B batch, H heads, T frames, D head dim. q, k, v: (B, H, T, D); lengths: (B,) int.
Mask semantics: ``usmkit.models.masks``. Every implementation is tested against ``reference``.
"""

from __future__ import annotations

from typing import Literal

import torch

Impl = Literal["reference", "sdpa", "flex", "triton"]
IMPLS: tuple[str, ...] = ("reference", "sdpa", "flex", "triton")


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    chunk_size: int | None,
    left_chunks: int,
    impl: Impl = "sdpa",
) -> torch.Tensor:
    """Chunk-wise masked attention. Returns (B, H, T, D); rows of padded queries are 0."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if impl == "reference":
        from usmkit.kernels.chunk_attention.reference import chunk_attention_reference

        return chunk_attention_reference(q, k, v, lengths, chunk_size, left_chunks)
    if impl == "sdpa":
        from usmkit.kernels.chunk_attention.sdpa import chunk_attention_sdpa

        return chunk_attention_sdpa(q, k, v, lengths, chunk_size, left_chunks)
    if impl == "flex":
        from usmkit.kernels.chunk_attention.flex import chunk_attention_flex

        return chunk_attention_flex(q, k, v, lengths, chunk_size, left_chunks)
    if impl == "triton":
        from usmkit.kernels.chunk_attention.triton import chunk_attention_triton

        return chunk_attention_triton(q, k, v, lengths, chunk_size, left_chunks)
    raise ValueError(f"unknown attention impl {impl!r}; choose one of {IMPLS}")
