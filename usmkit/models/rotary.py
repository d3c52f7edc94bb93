"""Rotary position embedding (RoPE), applied to q and k before any attention implementation.

Shapes: B batch, H heads, T frames, Dh head dim (even).

Channel pairs are ``(i, i + Dh/2)`` (the "rotate half" layout). Positions are absolute encoder frame
indices; a streaming caller passes the offset of its chunk, so the same frame gets the same rotation
in the full forward and chunk by chunk. Angles are computed in float32 whatever the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angles ``positions * base^(-2i/Dh)``: (..., T) -> (..., T, Dh/2), float32."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    return positions.to(torch.float32)[..., None] * inv_freq  # (..., T, Dh/2)


@dataclass(frozen=True)
class RotaryTable:
    """cos and sin of the rotation angles of some positions, (T, Dh/2) or (B, 1, T, Dh/2) float32.

    Every layer rotates the same positions, so a caller that runs the layers itself (streaming) builds
    the table once per chunk instead of once per layer and projection.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(cls, positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> RotaryTable:
        if head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head dim, got {head_dim}")
        angles = rotary_angles(positions, head_dim, base)  # (T, Dh/2) or (B, T, Dh/2)
        if angles.dim() == 3:
            angles = angles[:, None]  # (B, 1, T, Dh/2)
        return cls(angles.cos(), angles.sin())


def apply_rotary(x: torch.Tensor, positions: torch.Tensor | RotaryTable, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` (..., B, H, T, Dh) by the positions (T,) or (B, T) of its frames (or their ``RotaryTable``).

    Returns x's shape and dtype. Dot products of rotated vectors depend only on the difference of
    their positions.
    """
    table = positions if isinstance(positions, RotaryTable) else RotaryTable.build(positions, x.shape[-1], base)
    cos, sin = table.cos, table.sin
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (B, H, T, Dh)
    return rotated.to(x.dtype)
