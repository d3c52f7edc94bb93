"""Time reduction in front of the Conformer: stride-2 conv2d stages with ReLU, then a linear projection
(``Conv2dSubsampling``, usmkit's own), frames stacked side by side, LayerNorm, Linear (``StackingFrontEnd``,
w2v-BERT 2.0's feature projection), or NeMo's padded depthwise-striding stages (``DwStridingSubsampling``,
FastConformer's and NEST's).

Shapes: B batch, T feature frames (10 ms), F feature bins, C conv channels, s subsampling factor,
T' = encoder frames (10 s ms: 40 ms at 4x, 80 ms at 8x), D model dim.

``factor=4`` has two kernel-3 stride-2 stages (the Conformer paper's front end); ``factor=8`` one more
of the same kind (FastConformer's 8x rate, NeMo; NeMo makes its stages depthwise-separable, ours stay
full 3x3 convolutions: at 256 channels the third stage runs on a grid of T/8 x F/8 positions and
costs ``9 C^2 F/8`` multiply-adds per 80 ms frame, about 5M at F = 80, a quarter of one ``large``
block's ~25M per 40 ms frame, while every block behind it runs on half the frames).

No padding in any convolution, so with s = 2^k stages' stride an output frame ``t`` reads input frames
``s t .. s t + 2 s - 2`` only (receptive field ``2 s - 1``: 7 at 4x, 15 at 8x) and the valid outputs of
a row (``t < output_lengths(lengths, s)``) never read its padding.
"""

from __future__ import annotations

import torch
from torch import nn

from usmkit.models.dropout import Dropout

FACTORS = (4, 8)  # supported subsampling factors: 2 or 3 stride-2 stages
FRONT_ENDS = ("conv2d", "stack", "dw_striding")  # ConformerConfig.front_end: the three classes below


def check_factor(factor: int) -> int:
    """The number of stride-2 stages of ``factor``; ValueError unless it is one of ``FACTORS``."""
    if factor not in FACTORS or isinstance(factor, bool):
        raise ValueError(f"subsampling_factor must be one of {FACTORS} (stride-2 conv stages: 2 or 3), got {factor!r}")
    return factor.bit_length() - 1


def receptive_field(factor: int = 4) -> int:
    """Input frames one output frame reads: ``2 factor - 1`` (7 at 4x, 15 at 8x)."""
    check_factor(factor)
    return 2 * factor - 1


def feature_context(factor: int = 4, front_end: str = "conv2d") -> int:
    """Input frames read by two consecutive output chunks: ``receptive_field - factor`` (3 at 4x, 7 at 8x);
    0 for ``front_end="stack"`` (``StackingFrontEnd``); ValueError for ``"dw_striding"``, which does not stream."""
    if front_end == "dw_striding":
        raise ValueError(
            "front_end='dw_striding' (NeMo's padded depthwise-striding subsampling) reads ahead across chunk edges: "
            "it does not stream"
        )
    return 0 if front_end == "stack" else receptive_field(factor) - factor


def conv_out_size(size: int, factor: int = 4) -> int:
    """Size after the unpadded kernel-3 stride-2 stages: ``(n - 1) // 2`` per stage.

    >>> conv_out_size(80), conv_out_size(80, 8)
    (19, 9)
    """
    for _ in range(check_factor(factor)):
        size = (size - 1) // 2
    return size


def output_lengths(lengths: torch.Tensor, factor: int = 4, front_end: str = "conv2d") -> torch.Tensor:
    """Valid encoder frames for ``lengths`` valid feature frames; (B,) -> (B,), never negative.
    ``front_end="stack"``: ``lengths // factor`` (``StackingFrontEnd``).

    >>> output_lengths(torch.tensor([0, 6, 7, 10, 11, 100])).tolist()
    [0, 0, 1, 1, 2, 24]
    >>> output_lengths(torch.tensor([14, 15, 22, 23, 100]), factor=8).tolist()
    [0, 1, 1, 2, 12]
    """
    if front_end == "stack":
        return torch.div(lengths, factor, rounding_mode="floor")
    if front_end == "dw_striding":
        return dw_striding_lengths(lengths, factor)
    for _ in range(check_factor(factor)):
        lengths = torch.div(lengths - 1, 2, rounding_mode="floor")
    return lengths.clamp(min=0)


def check_features(features: torch.Tensor, input_dim: int) -> None:
    """ValueError unless ``features`` is (B, T, input_dim): what every front end takes."""
    if features.dim() != 3 or features.shape[-1] != input_dim:
        raise ValueError(
            f"features must be (batch, frames, {input_dim}); got {tuple(features.shape)} "
            "(is the feature extractor's number of mel bins the same as ConformerConfig.input_dim?)"
        )


class Conv2dSubsampling(nn.Module):
    """(B, T, F) features -> (B, T', D) frames at 1 / ``factor`` of the frame rate."""

    def __init__(self, input_dim: int, channels: int, d_model: int, dropout: float = 0.0, factor: int = 4) -> None:
        super().__init__()
        stages = check_factor(factor)
        self.input_dim = input_dim
        self.factor = factor
        self.receptive_field = receptive_field(factor)
        layers: list[nn.Module] = []
        for i in range(stages):  # conv.0, conv.2 (, conv.4): the weights' names do not depend on the factor
            layers += [nn.Conv2d(1 if i == 0 else channels, channels, kernel_size=3, stride=2), nn.ReLU()]
        self.conv = nn.Sequential(*layers)
        self.proj = nn.Linear(channels * conv_out_size(input_dim, factor), d_model)
        self.dropout = Dropout(dropout)

    @property
    def feature_context(self) -> int:
        """Input frames two consecutive output chunks both read (3 at 4x, 7 at 8x)."""
        return feature_context(self.factor)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Valid output frames for ``lengths`` valid input frames, (B,) -> (B,)."""
        return output_lengths(lengths, self.factor)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> frames (B, T', D), output lengths (B,)."""
        check_features(features, self.input_dim)
        B, T, F = features.shape
        if T < self.receptive_field:
            raise ValueError(
                f"need at least {self.receptive_field} feature frames for {self.factor}x conv subsampling, got {T}; "
                f"pad the batch or drop utterances shorter than {10 * self.receptive_field} ms"
            )
        x = self.conv(features.unsqueeze(1))  # (B, C, T', F')
        C, T2, F2 = x.shape[1:]
        x = x.transpose(1, 2).reshape(B, T2, C * F2)  # (B, T', C * F')
        return self.dropout(self.proj(x)), self.output_lengths(lengths)  # (B, T', D), (B,)


class StackingFrontEnd(nn.Module):
    """(B, T, F) features -> (B, T // s, D): each s consecutive frames side by side (B, T // s, s F), LayerNorm,
    Linear, dropout. A trailing T mod s frames are dropped (as SeamlessM4T's feature extractor does).

    Output frame ``t`` reads input frames ``s t .. s t + s - 1`` only: two chunks share no input frame
    (``feature_context`` 0) and valid outputs (``t < lengths // s``) never read padding.
    """

    def __init__(self, input_dim: int, factor: int, d_model: int, dropout: float = 0.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.factor = factor
        self.receptive_field = factor
        self.norm = nn.LayerNorm(factor * input_dim, eps=eps)
        self.proj = nn.Linear(factor * input_dim, d_model)
        self.dropout = Dropout(dropout)

    @property
    def feature_context(self) -> int:
        return feature_context(self.factor, "stack")

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Valid output frames for ``lengths`` valid input frames, (B,) -> (B,).

        >>> StackingFrontEnd(80, 2, 8).output_lengths(torch.tensor([0, 1, 2, 7])).tolist()
        [0, 0, 1, 3]
        """
        return output_lengths(lengths, self.factor, "stack")

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> frames (B, T // s, D), output lengths (B,)."""
        check_features(features, self.input_dim)
        B, T, F = features.shape
        T2 = T // self.factor
        if T2 < 1:
            raise ValueError(f"need at least {self.factor} feature frames to stack {self.factor} into one, got {T}")
        x = features[:, : T2 * self.factor].reshape(B, T2, self.factor * F)  # (B, T', s F): frame s t's bins first
        return self.dropout(self.proj(self.norm(x))), self.output_lengths(lengths)  # (B, T', D), (B,)


def dw_striding_lengths(lengths: torch.Tensor, factor: int = 8) -> torch.Tensor:
    """Valid output frames of ``DwStridingSubsampling``: ``(n - 1) // 2 + 1`` per stage (kernel 3, stride 2,
    one frame of zero padding each side; NeMo's ``calc_length``), (B,) -> (B,).

    >>> dw_striding_lengths(torch.tensor([0, 1, 8, 9, 100])).tolist()
    [0, 1, 1, 2, 13]
    """
    for _ in range(check_factor(factor)):
        lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
    return lengths.clamp(min=0)


class DwStridingSubsampling(nn.Module):
    """NeMo's ``ConvSubsampling(subsampling="dw_striding")`` (FastConformer, NEST): (B, T, F) -> (B, T', D).

    A kernel-3 stride-2 conv2d (1 -> C channels, padding 1) and ReLU, then per further stage a depthwise
    kernel-3 stride-2 conv2d (padding 1), a pointwise 1x1 conv2d and ReLU; ``proj`` maps C x F' to D.
    ``conv.N`` are NeMo's ``pre_encode.conv.N`` (0 conv, 1 ReLU, 2 depthwise, 3 pointwise, 4 ReLU, ...).

    As NeMo's ``MaskedConvSequential``, the frames after each row's valid length are zeroed before every
    layer, so a row's valid output never depends on the batch's padding: it equals the row encoded alone.
    The convolutions are padded and read one frame ahead, so two streaming chunks cannot be encoded
    apart: this front end does not stream, and packed rows (which it would read across) are refused.
    """

    def __init__(self, input_dim: int, channels: int, d_model: int, dropout: float = 0.0, factor: int = 8) -> None:
        super().__init__()
        stages = check_factor(factor)
        self.input_dim = input_dim
        self.factor = factor
        layers: list[nn.Module] = [nn.Conv2d(1, channels, kernel_size=3, stride=2, padding=1), nn.ReLU()]
        for _ in range(stages - 1):
            layers += [
                nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=1, groups=channels),
                nn.Conv2d(channels, channels, kernel_size=1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers)
        bins = input_dim
        for _ in range(stages):
            bins = (bins - 1) // 2 + 1
        self.proj = nn.Linear(channels * bins, d_model)
        self.dropout = Dropout(dropout)

    @property
    def feature_context(self) -> int:
        return feature_context(self.factor, "dw_striding")  # raises: this front end does not stream

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Valid output frames for ``lengths`` valid input frames, (B,) -> (B,)."""
        return dw_striding_lengths(lengths, self.factor)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> frames (B, T', D), output lengths (B,)."""
        check_features(features, self.input_dim)
        x = features.unsqueeze(1)  # (B, 1, T, F)
        current = lengths
        for layer in self.conv:
            keep = torch.arange(x.shape[2], device=x.device)[None, :] < current[:, None]  # (B, T_i)
            x = layer(x * keep[:, None, :, None].to(x.dtype))
            if isinstance(layer, nn.Conv2d) and layer.stride != (1, 1):
                current = torch.div(current - 1, 2, rounding_mode="floor") + 1  # NeMo's calculate_conv_output_size
        keep = torch.arange(x.shape[2], device=x.device)[None, :] < current[:, None]  # (B, T')
        x = x * keep[:, None, :, None].to(x.dtype)  # (B, C, T', F')
        B, C, T2, F2 = x.shape
        x = x.transpose(1, 2).reshape(B, T2, C * F2)  # (B, T', C * F')
        return self.dropout(self.proj(x)), self.output_lengths(lengths)  # (B, T', D), (B,)
