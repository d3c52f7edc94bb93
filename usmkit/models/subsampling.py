"""4x time reduction in front of the Conformer: two stride-2 conv2d layers, ReLU, then a linear projection.

Shapes: B batch, T feature frames (10 ms), F feature bins, C conv channels, T' = encoder frames (40 ms),
D model dim.

No padding in either convolution, so an output frame ``t`` reads input frames ``4t .. 4t + 6`` only and
the valid outputs of a row (``t < output_lengths(lengths)``) never read its padding.
"""

from __future__ import annotations

import torch
from torch import nn

from usmkit.models.dropout import Dropout

SUBSAMPLING_FACTOR = 4
RECEPTIVE_FIELD = 7  # input frames read by one output frame: 4t .. 4t + 6


def conv_out_size(size: int) -> int:
    """Size after the two kernel-3 stride-2 unpadded convolutions: ``((n - 1) // 2 - 1) // 2``."""
    return ((size - 1) // 2 - 1) // 2


def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """Valid encoder frames for ``lengths`` valid feature frames; (B,) -> (B,), never negative.

    >>> output_lengths(torch.tensor([0, 6, 7, 10, 11, 100])).tolist()
    [0, 0, 1, 1, 2, 24]
    """
    once = torch.div(lengths - 1, 2, rounding_mode="floor")
    twice = torch.div(once - 1, 2, rounding_mode="floor")
    return twice.clamp(min=0)


class Conv2dSubsampling(nn.Module):
    """(B, T, F) features -> (B, T', D) frames at a quarter of the frame rate."""

    def __init__(self, input_dim: int, channels: int, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, kernel_size=3, stride=2),
            nn.ReLU(),
            nn.Conv2d(channels, channels, kernel_size=3, stride=2),
            nn.ReLU(),
        )
        self.proj = nn.Linear(channels * conv_out_size(input_dim), d_model)
        self.dropout = Dropout(dropout)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> frames (B, T', D), output lengths (B,)."""
        if features.dim() != 3 or features.shape[-1] != self.input_dim:
            raise ValueError(
                f"features must be (batch, frames, {self.input_dim}); got {tuple(features.shape)} "
                "(is the feature extractor's number of mel bins the same as ConformerConfig.input_dim?)"
            )
        B, T, F = features.shape
        if T < RECEPTIVE_FIELD:
            raise ValueError(
                f"need at least {RECEPTIVE_FIELD} feature frames for 4x conv subsampling, got {T}; "
                "pad the batch or drop utterances shorter than 70 ms"
            )
        x = self.conv(features.unsqueeze(1))  # (B, C, T', F')
        C, T2, F2 = x.shape[1:]
        x = x.transpose(1, 2).reshape(B, T2, C * F2)  # (B, T', C * F')
        return self.dropout(self.proj(x)), output_lengths(lengths)  # (B, T', D), (B,)
