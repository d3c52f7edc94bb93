"""Typed configuration of the chunk-wise-attention Conformer encoder.

Size presets (``tiny`` ... ``usm2b``) are builder functions in ``usmkit.models.presets``.
"""

from __future__ import annotations

from dataclasses import dataclass

from usmkit.kernels.chunk_attention.api import IMPLS
from usmkit.kernels.masks import check_chunk_args
from usmkit.models.subsampling import check_factor, conv_out_size, receptive_field

CONV_IMPLS = ("torch", "triton")


@dataclass(frozen=True, kw_only=True)
class ConformerConfig:
    """Hyper-parameters of ``ConformerEncoder``.

    ``chunk_size`` counts encoder frames (after the ``subsampling_factor``: 40 ms each at 4x and a 10 ms
    hop, 80 ms at 8x); ``None`` is full attention. ``left_chunks``: -1 all left context, 0 USM's disjoint chunks,
    k > 0 k chunks of history (streaming). ``attention_impl`` is one of
    ``usmkit.kernels.chunk_attention.api.IMPLS``. ``conv_impl``: ``"torch"`` runs the convolution module as
    PyTorch operations; ``"triton"`` runs its middle (GLU, depthwise convolution, LayerNorm, Swish) as one fused
    Triton kernel forward and two backward (``usmkit.kernels.conv_module``) wherever Triton runs (CUDA), and as
    ``"torch"`` elsewhere and in the streaming step; both compute the same function.
    """

    input_dim: int = 80  # feature bins (log-mel); USM used 128
    d_model: int
    num_layers: int
    num_heads: int
    ff_mult: int = 4  # feed-forward hidden = ff_mult * d_model
    conv_kernel: int = 5  # depthwise convolution kernel (USM: 5)
    causal_conv: bool = False  # pad the depthwise convolution on the left only (streaming)
    dropout: float = 0.1
    chunk_size: int | None = None
    left_chunks: int = 0
    attention_impl: str = "sdpa"
    conv_impl: str = "torch"
    subsampling_channels: int | None = None  # conv2d channels of the subsampling; None = d_model
    subsampling_factor: int = 4  # 4 (two stride-2 conv stages) or 8 (three; FastConformer's rate)
    rotary_base: float = 10000.0
    # Every residual branch's last projection starts at zero, so each block starts as the identity
    # (then its LayerNorm) and the encoder as front end + norms: without it, the random branches of a
    # deep stack bury the input, and CTC stays in its all-blank phase for far longer.
    zero_init_residual: bool = True

    def __post_init__(self) -> None:
        for name in ("input_dim", "d_model", "num_layers", "num_heads", "ff_mult", "conv_kernel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ConformerConfig.{name} must be a positive int, got {value!r}")
        check_factor(self.subsampling_factor)
        if conv_out_size(self.input_dim, self.subsampling_factor) < 1:
            minimum = receptive_field(self.subsampling_factor)
            raise ValueError(
                f"ConformerConfig.input_dim={self.input_dim} is too small for {self.subsampling_factor}x subsampling "
                f"(stride-2 kernel-3 convolutions); use >= {minimum} feature bins (80 is usual)"
            )
        if self.d_model % self.num_heads != 0:
            raise ValueError(f"ConformerConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"rotary positions need an even head dim; d_model={self.d_model} / num_heads={self.num_heads} "
                f"= {self.head_dim}"
            )
        if not self.causal_conv and self.conv_kernel % 2 == 0:
            raise ValueError(
                f"ConformerConfig.conv_kernel={self.conv_kernel} must be odd for a centred (non-causal) "
                "convolution; use an odd kernel or causal_conv=True"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ConformerConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.attention_impl not in IMPLS:
            raise ValueError(
                f"ConformerConfig.attention_impl={self.attention_impl!r} is unknown; choose one of {IMPLS}"
            )
        if self.conv_impl not in CONV_IMPLS:
            raise ValueError(f"ConformerConfig.conv_impl={self.conv_impl!r} is unknown; choose one of {CONV_IMPLS}")
        if self.subsampling_channels is not None and self.subsampling_channels <= 0:
            raise ValueError(
                f"ConformerConfig.subsampling_channels must be positive or None (= d_model), got {self.subsampling_channels}"
            )
        if self.rotary_base <= 1.0:
            raise ValueError(f"ConformerConfig.rotary_base must be > 1, got {self.rotary_base}")
        check_chunk_args(self.chunk_size, self.left_chunks)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def conv_channels(self) -> int:
        """Channels of the conv2d subsampling."""
        return self.d_model if self.subsampling_channels is None else self.subsampling_channels
