"""The duration model of MOST's text encoder: per-token durations, and upsampling tokens to frames.

Shapes: B batch, U tokens, T encoder frames (40 ms), D model dim.

A duration counts encoder frames. The predictor works in log space (durations are >= 1 frame and
spread over an order of magnitude); its targets come from CTC alignments (``usmkit.ssl.alignment``).
Upsampling repeats token i's vector ``durations[i]`` times, so an utterance of U tokens becomes
``sum(durations)`` frames (FastSpeech's length regulator, Maestro's upsampler).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class DurationPredictor(nn.Module):
    """Token states (B, U, D) -> predicted log durations (B, U), float32.

    Two-layer MLP per token: the token blocks before it have already mixed in the neighbours
    (attention and convolution), which is what the duration of a piece depends on.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1).float()  # (B, U)


def durations_from_log(log_durations: torch.Tensor, token_lens: torch.Tensor, max_frames: int) -> torch.Tensor:
    """Predicted log durations (B, U) -> whole frames (B, U) int64, each in [1, max_frames], 0 at padded tokens."""
    frames = log_durations.detach().float().exp().round().clamp(1, max_frames).long()  # (B, U)
    valid = torch.arange(frames.shape[1], device=frames.device) < token_lens[:, None]  # (B, U)
    return frames * valid


def upsample(
    x: torch.Tensor,
    durations: torch.Tensor,
    num_frames: int | None = None,
    round_up: Callable[[int], int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Repeat each token's vector for its duration.

    x (B, U, D), durations (B, U) int64 >= 0 (0 at padded tokens) -> frames (B, T, D) zero-padded,
    lengths (B,) = durations.sum(1), token index (B, T) and frame offset inside its token (B, T) (both 0
    at padded frames). T = ``num_frames`` when given (it must hold the longest row), else the longest
    row's length (one host sync), raised to ``round_up(longest)`` when given (a padded length >= longest).

    >>> f, n, idx, off = upsample(torch.tensor([[[1.0], [2.0]]]), torch.tensor([[2, 1]]))
    >>> f.squeeze(-1).tolist(), n.tolist(), idx.tolist(), off.tolist()
    ([[1.0, 1.0, 2.0]], [3], [[0, 0, 1]], [[0, 1, 0]])
    """
    B, U, D = x.shape
    ends = durations.cumsum(dim=1)  # (B, U): first frame after each token
    lengths = ends[:, -1].contiguous() if U > 0 else durations.new_zeros(B)  # a column view would recompile
    if num_frames is None:
        longest = int(lengths.max())
        T = round_up(longest) if round_up else longest
    else:
        T = num_frames
    if num_frames is not None and U > 0 and bool((lengths > num_frames).any()):
        raise ValueError(f"durations sum to {lengths.max().item()} frames, more than num_frames={num_frames}")
    t = torch.arange(T, device=x.device).expand(B, T)  # (B, T)
    valid = t < lengths[:, None]  # (B, T)
    index = torch.searchsorted(ends, t.contiguous(), right=True).clamp(max=max(U - 1, 0))  # (B, T)
    starts = ends - durations  # (B, U)
    offset = t - starts.gather(1, index)  # (B, T)
    frames = x.gather(1, index[:, :, None].expand(B, T, D))  # (B, T, D)
    frames = frames.masked_fill(~valid[:, :, None], 0.0)
    return frames, lengths, index * valid, offset * valid


def log_duration_errors(
    predicted: torch.Tensor, durations: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The duration loss and its accuracy metric over the tokens with weight 1.

    predicted (B, U) log durations, durations (B, U) int64 aligned frames (>= 1 where weighted),
    weights (B, U) 0/1 -> (mean squared log error, mean absolute log error); 0 when nothing is weighted.
    """
    target = durations.clamp(min=1).float().log()
    diff = (predicted.float() - target) * weights
    count = weights.sum().clamp(min=1)
    return diff.pow(2).sum() / count, diff.abs().sum() / count
