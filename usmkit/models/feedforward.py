"""The Conformer's (macaron) feed-forward module: pre-norm, expand, Swish, project back.

Shapes: B batch, T frames, D model dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from usmkit.models.dropout import Dropout

ACTIVATION_FNS = {"swish": F.silu, "gelu": F.gelu, "relu": F.relu}  # ConformerConfig.activation


class FeedForward(nn.Module):
    """LayerNorm -> Linear(D, ff_mult * D) -> Swish (or ``activation``) -> dropout -> Linear(ff_mult * D, D)
    -> dropout.

    Returns the residual branch (B, T, D); the block adds it (scaled by 0.5) to its input.
    Works frame by frame, so padding and chunking never matter here.
    """

    def __init__(
        self, d_model: int, ff_mult: int, dropout: float, activation: str = "swish", eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.act = ACTIVATION_FNS[activation]
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.up = nn.Linear(d_model, ff_mult * d_model)
        self.down = nn.Linear(ff_mult * d_model, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dropout(self.act(self.up(self.norm(x))))  # (B, T, ff_mult * D)
        return self.dropout(self.down(h))  # (B, T, D)
