"""Typed configuration of the chunk-wise-attention Conformer encoder.

Size presets (``tiny`` ... ``usm2b``) are builder functions in ``usmkit.models.presets``.
"""

from __future__ import annotations

from dataclasses import dataclass

from usmkit.kernels.chunk_attention.api import IMPLS
from usmkit.kernels.masks import check_chunk_args
from usmkit.models.subsampling import FRONT_ENDS, check_factor, conv_out_size, receptive_field

CONV_IMPLS = ("torch", "triton")
POSITIONS = ("rotary", "relative_key", "rel_pos_xl")
CONV_NORMS = ("layer_norm", "none")
ACTIVATIONS = ("swish", "gelu", "relu")


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

    Imported encoders (``usmkit.models.w2vbert``) set the fields after ``zero_init_residual``; their defaults
    are usmkit's own encoder. ``position="relative_key"``: no rotary, a learned embedding per clipped key -
    query distance in [-relative_left, relative_right] whose dot product with the query is added to the
    scores (w2v-BERT 2.0; not on the Triton kernel). ``front_end="stack"``: ``subsampling_factor`` frames
    stacked into one, LayerNorm, Linear (w2v-BERT 2.0's feature projection) instead of the conv stages.
    ``activation`` is the feed-forwards' and the convolution module's; ``layer_norm_eps`` every LayerNorm's.

    NEST / FastConformer (``usmkit.models.nest``): ``position="rel_pos_xl"`` is Transformer-XL's relative
    positions (NeMo's ``rel_pos``): per layer learned ``pos_bias_u`` / ``pos_bias_v`` and a projection of the
    sinusoidal encoding of every query - key distance, unclipped. ``front_end="dw_striding"``: NeMo's padded
    depthwise-striding conv subsampling (``subsampling_channels`` channels; it does not stream).
    ``conv_norm="none"``: no norm after the depthwise convolution (an imported batch norm is folded into it).
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
    position: str = "rotary"  # rotary, relative_key (a learned clipped-distance bias) or rel_pos_xl (Transformer-XL)
    relative_left: int = 64  # relative_key: key - query distances clipped to [-relative_left, relative_right]
    relative_right: int = 8
    front_end: str = "conv2d"  # conv2d (stride-2 conv stages), stack (frames + Linear) or dw_striding (NeMo's)
    activation: str = "swish"  # swish, gelu or relu: the feed-forwards' and the convolution module's
    layer_norm_eps: float = 1e-5
    conv_norm: str = "layer_norm"  # layer_norm or none (the depthwise convolution holds a folded batch norm)

    def __post_init__(self) -> None:
        for name in ("input_dim", "d_model", "num_layers", "num_heads", "ff_mult", "conv_kernel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ConformerConfig.{name} must be a positive int, got {value!r}")
        if self.front_end not in FRONT_ENDS:
            raise ValueError(f"ConformerConfig.front_end={self.front_end!r} is unknown; choose one of {FRONT_ENDS}")
        if self.front_end == "dw_striding":
            check_factor(self.subsampling_factor)
        elif self.front_end == "stack":
            if not isinstance(self.subsampling_factor, int) or not 1 <= self.subsampling_factor <= 8:
                raise ValueError(
                    f"ConformerConfig.subsampling_factor={self.subsampling_factor!r}: front_end='stack' stacks 1 to 8 "
                    "feature frames into one"
                )
        else:
            check_factor(self.subsampling_factor)
            if conv_out_size(self.input_dim, self.subsampling_factor) < 1:
                minimum = receptive_field(self.subsampling_factor)
                raise ValueError(
                    f"ConformerConfig.input_dim={self.input_dim} is too small for {self.subsampling_factor}x subsampling "
                    f"(stride-2 kernel-3 convolutions); use >= {minimum} feature bins (80 is usual)"
                )
        if self.d_model % self.num_heads != 0:
            raise ValueError(f"ConformerConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.position not in POSITIONS:
            raise ValueError(f"ConformerConfig.position={self.position!r} is unknown; choose one of {POSITIONS}")
        if self.position == "relative_key":
            if self.relative_left < 0 or self.relative_right < 0:
                raise ValueError(
                    f"ConformerConfig.relative_left/right must be >= 0, got {self.relative_left}, {self.relative_right}"
                )
        if self.position != "rotary":
            if self.attention_impl == "triton":
                raise ValueError(
                    f"ConformerConfig.attention_impl='triton' takes rotary positions only; position={self.position!r} "
                    "runs on attention_impl='sdpa', 'flex' or 'reference'"
                )
        elif self.head_dim % 2 != 0:
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
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ConformerConfig.activation={self.activation!r} is unknown; choose one of {ACTIVATIONS}")
        if self.conv_norm not in CONV_NORMS:
            raise ValueError(f"ConformerConfig.conv_norm={self.conv_norm!r} is unknown; choose one of {CONV_NORMS}")
        if self.conv_impl == "triton" and self.conv_norm != "layer_norm":
            raise ValueError(
                "ConformerConfig.conv_impl='triton' fuses the LayerNorm conv_norm only; use conv_impl='torch'"
            )
        if self.conv_impl == "triton" and self.activation != "swish":
            raise ValueError("ConformerConfig.conv_impl='triton' fuses Swish only; use conv_impl='torch'")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"ConformerConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
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
