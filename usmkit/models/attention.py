"""Multi-head self-attention with rotary positions under the chunk-wise mask.

Shapes: B batch, T frames, D model dim, H heads, Dh = D / H head dim.

Pre-norm LayerNorm -> fused q/k/v projection -> rotary on q and k -> ``chunk_attention`` (one
signature, several implementations: ``usmkit.kernels.chunk_attention.api``) -> output projection
-> dropout. ``project_qkv`` and ``project_out`` are separate so a streaming step can attend over
cached keys and values of the left chunks with the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

from usmkit.kernels.chunk_attention.api import Impl, chunk_attention
from usmkit.models.dropout import Dropout
from usmkit.models.rotary import RotaryTable, apply_rotary


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float, impl: Impl, rotary_base: float = 10000.0) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.impl = impl
        self.rotary_base = rotary_base
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor | RotaryTable
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D), positions (T,) or (B, T) absolute frame indices (or their ``RotaryTable``) ->
        rotated q, k and v, each (B, H, T, Dh)."""
        B, T, D = x.shape
        qkv = self.qkv(self.norm(x)).view(B, T, 3, self.num_heads, D // self.num_heads)  # (B, T, 3, H, Dh)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        q, k = apply_rotary(qkv[:2], positions, self.rotary_base).unbind(0)  # q and k in one go: (B, H, T, Dh) each
        return q, k, qkv[2]

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn (B, H, T, Dh) -> residual branch (B, T, D)."""
        B, H, T, Dh = attn.shape
        y = attn.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)
        return self.dropout(self.out(y))

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        positions: torch.Tensor,
        chunk_size: int | None,
        left_chunks: int,
    ) -> torch.Tensor:
        """x (B, T, D), lengths (B,), positions (T,) -> residual branch (B, T, D); padded frames give 0 + bias."""
        q, k, v = self.project_qkv(x, positions)
        attn = chunk_attention(q, k, v, lengths, chunk_size, left_chunks, impl=self.impl)  # (B, H, T, Dh)
        return self.project_out(attn)
