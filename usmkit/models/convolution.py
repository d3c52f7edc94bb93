"""The Conformer convolution module, with a causal option and padding that never leaks.

Shapes: B batch, T frames, D model dim, K kernel.

LayerNorm -> pointwise (D -> 2D) -> GLU -> zero padded frames -> depthwise conv (K) -> LayerNorm
-> Swish -> pointwise (D -> D) -> dropout. The norm after the depthwise conv is a LayerNorm over
channels, not BatchNorm: it is per frame, so batch composition, padding and streaming cannot change
a frame's output (``norm="none"`` drops it: an imported encoder's batch norm, an affine map per channel in
inference, is folded into the depthwise convolution, ``usmkit.models.nest``). Pointwise convolutions are ``nn.Linear`` on (B, T, D) (the same operation as a
kernel-1 Conv1d, without the transposes).

Packed rows (several utterances per row): ``depthwise(y, segment_ids=ids)`` drops every tap that reads
a frame of another utterance, so each utterance is convolved as if it were alone in its row with zero
padding around it.

Fused (``impl="triton"``, where Triton runs): ``forward`` runs everything between the two pointwise projections
as one kernel (``usmkit.kernels.conv_module``), the same function as the three stages below.

Streaming: the three stages are separate methods. ``depthwise(y, context)`` takes the last K - 1
frames of the previous chunk's ``pointwise_in`` output as ``context`` (for ``causal=True``); the full
forward passes no context, which is zero padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from usmkit.kernels.conv_module.api import available, conv_mid
from usmkit.models.dropout import Dropout
from usmkit.models.feedforward import ACTIVATION_FNS


class ConvolutionModule(nn.Module):
    def __init__(
        self,
        d_model: int,
        kernel_size: int,
        causal: bool,
        dropout: float,
        impl: str = "torch",
        activation: str = "swish",
        eps: float = 1e-5,
        norm: str = "layer_norm",
    ) -> None:
        super().__init__()
        self.act = ACTIVATION_FNS[activation]
        if not causal and kernel_size % 2 == 0:
            raise ValueError(f"a centred depthwise convolution needs an odd kernel, got {kernel_size}")
        self.kernel_size = kernel_size
        self.causal = causal
        self.impl = impl
        self.norm_in = nn.LayerNorm(d_model, eps=eps)
        self.pointwise1 = nn.Linear(d_model, 2 * d_model)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model)  # unpadded; see depthwise()
        self.norm_mid: nn.Module = nn.LayerNorm(d_model, eps=eps) if norm == "layer_norm" else nn.Identity()
        self.pointwise2 = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    @property
    def left_context(self) -> int:
        """Frames of left context the depthwise convolution reads (the streaming tail length)."""
        return self.kernel_size - 1 if self.causal else (self.kernel_size - 1) // 2

    def pointwise_in(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D): norm, pointwise + GLU; frames where ``valid`` (B, T) is False are zeroed."""
        y = F.glu(self.pointwise1(self.norm_in(x)), dim=-1)  # (B, T, D)
        return y.masked_fill(~valid[:, :, None], 0.0)

    def depthwise(
        self, y: torch.Tensor, context: torch.Tensor | None = None, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Depthwise conv over time, (B, T, D) -> (B, T, D).

        ``context`` (B, left_context, D) replaces the zero left padding (streaming); right padding
        (non-causal only) is always zeros, i.e. what follows the last valid frame. ``segment_ids`` (B, T)
        (packed rows, ``usmkit.kernels.masks.Segments.ids``): taps across an utterance boundary read zero.

        Three ways to the same result, each where it is fastest (our own code, not ``nn.Conv1d``,
        in two of them):

        - Under ``torch.compile``: K shifted multiply-adds, which inductor fuses with the GLU before
          and the norm after, which saves the round trips to memory that cuDNN's separate depthwise
          kernel needs (``bench/profile_step.py``).
        - With ``context`` (a streaming chunk of a few frames, eager): unfold, multiply and sum;
          on so few frames oneDNN's depthwise ``nn.Conv1d`` spends longer setting up than computing.
        - Otherwise (whole utterances, eager) ``nn.Conv1d``, which does not materialize windows.
        """
        left = self.left_context
        right = self.kernel_size - 1 - left
        if segment_ids is not None:
            if context is not None:
                raise ValueError("a streaming chunk (context) holds one utterance: it takes no segment_ids")
            return self._depthwise_segments(y, segment_ids, left, right)
        if torch.compiler.is_compiling():
            seq = torch.cat([context, y], dim=1) if context is not None else F.pad(y, (0, 0, left, 0))
            seq = F.pad(seq, (0, 0, 0, right))  # (B, T + K - 1, D)
            T, w = y.shape[1], self.depthwise_conv.weight[:, 0, :]  # (D, K)
            out = seq[:, :T] * w[:, 0]
            for k in range(1, self.kernel_size):
                out = out + seq[:, k : k + T] * w[:, k]
            # The bias goes last: inductor's C++ (CPU) code for the sum started from the bias, fused with
            # the norm that follows, computes wrong values (torch 2.11; tests/models/test_depthwise_compile.py).
            return out + self.depthwise_conv.bias  # (B, T, D)
        if context is not None:
            seq = F.pad(torch.cat([context, y], dim=1), (0, 0, 0, right))  # (B, left + T + right, D)
            windows = seq.unfold(1, self.kernel_size, 1)  # (B, T, D, Kc)
            return (windows * self.depthwise_conv.weight[:, 0, :]).sum(-1) + self.depthwise_conv.bias  # (B, T, D)
        y = F.pad(y.transpose(1, 2), (left, right))  # (B, D, left + T + right)
        return self.depthwise_conv(y).transpose(1, 2)  # (B, T, D)

    def _depthwise_segments(self, y: torch.Tensor, ids: torch.Tensor, left: int, right: int) -> torch.Tensor:
        """K shifted multiply-adds (as the compiled path), each tap zeroed where it reads another utterance:
        y (B, T, D), ids (B, T) -> (B, T, D). Padded frames of y are zero already (``pointwise_in``)."""
        T, w = y.shape[1], self.depthwise_conv.weight[:, 0, :]  # (D, K)
        seq = F.pad(y, (0, 0, left, right))  # (B, T + K - 1, D)
        seq_ids = F.pad(ids, (left, right), value=-1)  # (B, T + K - 1)
        out = None
        for k in range(self.kernel_size):
            same = (seq_ids[:, k : k + T] == ids).to(y.dtype)[:, :, None]  # (B, T, 1): tap k stays inside
            term = seq[:, k : k + T] * same * w[:, k]
            out = term if out is None else out + term
        return out + self.depthwise_conv.bias  # (B, T, D); the bias last, as in the compiled path

    def pointwise_out(self, y: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D): norm, Swish (or the configured activation), pointwise, dropout."""
        return self.dropout(self.pointwise2(self.act(self.norm_mid(y))))

    def forward(self, x: torch.Tensor, valid: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D), valid (B, T) bool, segment_ids (B, T) of packed rows or None -> residual branch (B, T, D)."""
        if self.impl == "triton" and self.act is F.silu and isinstance(self.norm_mid, nn.LayerNorm) and available(x):
            h = self.pointwise1(self.norm_in(x))  # (B, T, 2D)
            mid = conv_mid(
                h, valid, segment_ids, self.depthwise_conv.weight[:, 0, :], self.depthwise_conv.bias,
                self.norm_mid.weight, self.norm_mid.bias, self.norm_mid.eps, self.left_context,
            )  # fmt: skip
            return self.dropout(self.pointwise2(mid))  # (B, T, D)
        return self.pointwise_out(self.depthwise(self.pointwise_in(x, valid), segment_ids=segment_ids))
