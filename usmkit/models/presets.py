"""Encoder size presets as named builder functions; ``preset(name)`` is the one name lookup (for Hydra).

Parameter counts are for ``input_dim=80``, ``ff_mult=4``, ``conv_kernel=5`` (``tests/models/test_presets.py``
builds each on the meta device and checks them). Every builder takes ``**overrides`` of any
``ConformerConfig`` field, e.g. ``usm600m(input_dim=128, chunk_size=200)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from usmkit.models.config import ConformerConfig

# base and larger: 256 channels in the conv2d subsampling, not d_model. Its second convolution costs
# about 18 * C^2 * (F/4) FLOPs per output frame, which at C = d_model = 1024 is a third of a 16-layer
# stack's compute for 1-2% of the parameters; 256 channels keep it negligible.


def _build(base: dict[str, Any], overrides: dict[str, Any], name: str) -> ConformerConfig:
    fields = {f.name for f in dataclasses.fields(ConformerConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"preset {name!r}: unknown ConformerConfig field(s) {unknown}; valid fields: {sorted(fields)}")
    return ConformerConfig(**{**base, **overrides})


def tiny(**overrides: Any) -> ConformerConfig:
    """4 layers x 128 dim x 4 heads (head dim 32), 64 subsampling channels: 1.72M parameters.

    For CI and 2-core CPU training in a minute or two.
    """
    return _build(dict(d_model=128, num_layers=4, num_heads=4, subsampling_channels=64), overrides, "tiny")


def small(**overrides: Any) -> ConformerConfig:
    """18 layers x 256 dim x 4 heads (head dim 64): 29.1M parameters."""
    return _build(dict(d_model=256, num_layers=18, num_heads=4), overrides, "small")


def base(**overrides: Any) -> ConformerConfig:
    """16 layers x 512 dim x 8 heads (head dim 64): 99.8M parameters."""
    return _build(dict(d_model=512, num_layers=16, num_heads=8, subsampling_channels=256), overrides, "base")


def large(**overrides: Any) -> ConformerConfig:
    """16 layers x 1024 dim x 8 heads (head dim 128): 392.0M parameters (USM 0.6B's width, 2/3 its depth)."""
    return _build(dict(d_model=1024, num_layers=16, num_heads=8, subsampling_channels=256), overrides, "large")


def usm600m(**overrides: Any) -> ConformerConfig:
    """USM's 0.6B Conformer: 24 layers x 1024 dim x 8 heads (head dim 128), conv kernel 5: 585.2M parameters."""
    return _build(dict(d_model=1024, num_layers=24, num_heads=8, subsampling_channels=256), overrides, "usm600m")


def usm2b(**overrides: Any) -> ConformerConfig:
    """USM's 2B Conformer shape: 32 layers x 1536 dim x 16 heads (head dim 96), conv kernel 5: 1.746B parameters.

    The paper calls it 2B; with our blocks (ff_mult 4, rotary positions, no relative-position
    weights) and 80 mel bins the same shape counts 1.75B. The shape is kept, the count is what it is.
    """
    return _build(dict(d_model=1536, num_layers=32, num_heads=16, subsampling_channels=256), overrides, "usm2b")


def w2v_bert_2(**overrides: Any) -> ConformerConfig:
    """w2v-BERT 2.0's encoder (``facebook/w2v-bert-2.0``, imported with ``usmkit.cli.import_encoder``): 24 layers
    x 1024 dim x 16 heads (head dim 64), causal depthwise kernel 31, ``relative_key`` positions (64 frames left,
    8 right), 2 stacked 80-bin frames per 20 ms encoder frame, no dropout: 580.6M parameters.

    Its features are ``usmkit.data.config.seamless_m4t_features()``.
    """
    base = dict(
        d_model=1024, num_layers=24, num_heads=16, conv_kernel=31, causal_conv=True, dropout=0.0,
        zero_init_residual=False, position="relative_key", relative_left=64, relative_right=8,
        front_end="stack", subsampling_factor=2,
    )  # fmt: skip
    return _build(base, overrides, "w2v_bert_2")


def _nest(d_model: int, num_layers: int, overrides: dict[str, Any], name: str) -> ConformerConfig:
    base = dict(
        d_model=d_model, num_layers=num_layers, num_heads=8, conv_kernel=9, dropout=0.0, zero_init_residual=False,
        position="rel_pos_xl", front_end="dw_striding", subsampling_factor=8, subsampling_channels=256,
        conv_norm="none",
    )  # fmt: skip
    return _build(base, overrides, name)


def nest_large(**overrides: Any) -> ConformerConfig:
    """NVIDIA's NEST large (``ssl_en_nest_large_v1.0``, imported with ``usmkit.cli.import_encoder``): a FastConformer
    of 17 layers x 512 dim x 8 heads, depthwise kernel 9 (its batch norm folded in), Transformer-XL positions,
    8x depthwise-striding subsampling (256 channels) to 80 ms frames, 80 mel bins: 108.7M parameters
    after import (its batch norms folded into the convolutions)."""
    return _nest(512, 17, overrides, "nest_large")


def nest_xlarge(**overrides: Any) -> ConformerConfig:
    """NEST xlarge (``ssl_en_nest_xlarge_v1.0``): ``nest_large``'s blocks at 24 layers x 1024 dim, 8 heads:
    607.7M parameters after import."""
    return _nest(1024, 24, overrides, "nest_xlarge")


PRESETS: dict[str, Callable[..., ConformerConfig]] = {
    "tiny": tiny,
    "small": small,
    "base": base,
    "large": large,
    "usm600m": usm600m,
    "usm2b": usm2b,
    "w2v_bert_2": w2v_bert_2,
    "nest_large": nest_large,
    "nest_xlarge": nest_xlarge,
}


def preset(name: str, **overrides: Any) -> ConformerConfig:
    """The config of preset ``name`` (one of ``PRESETS``) with ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown encoder preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name](**overrides)
