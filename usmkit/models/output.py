"""What a training task returns from one forward pass; the trainer knows nothing else of the model."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepOutput:
    loss: torch.Tensor  # scalar to backpropagate
    # detached scalars to log (no .item() in the hot path)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
