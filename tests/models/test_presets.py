"""Size presets: each builds on the meta device (no memory) with the expected shape and parameter count."""

import pytest
import torch

from usmkit.models import presets
from usmkit.models.conformer import ConformerEncoder


def _count(cfg) -> int:
    with torch.device("meta"):
        encoder = ConformerEncoder(cfg)
    assert all(p.is_meta for p in encoder.parameters())
    return sum(p.numel() for p in encoder.parameters())


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("tiny", 1e6, 3e6),
        ("small", 25e6, 40e6),
        ("base", 80e6, 120e6),
        ("usm600m", 0.95 * 0.6e9, 1.05 * 0.6e9),
        ("usm2b", 1.5e9, 2.5e9),
        ("w2v_bert_2", 0.575e9, 0.585e9),  # facebook/w2v-bert-2.0's 580.5M, plus zero biases of its convolutions
    ],
)
def test_preset_parameter_count(name, low, high):
    n = _count(presets.preset(name))
    print(f"{name}: {n:,} parameters ({n / 1e6:.1f}M)")
    assert low <= n <= high


def test_usm_shapes_follow_the_paper():
    cfg = presets.usm600m()
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.conv_kernel) == (24, 1024, 8, 5)
    cfg = presets.usm2b()
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.conv_kernel) == (32, 1536, 16, 5)


def test_tiny_encoder_runs_on_cpu():
    encoder = ConformerEncoder(presets.tiny(chunk_size=8, dropout=0.0, zero_init_residual=False)).eval()
    with torch.no_grad():
        y, lens = encoder(torch.randn(2, 100, 80), torch.tensor([100, 60]))
    assert y.shape == (2, 24, 128) and lens.tolist() == [24, 14]


def test_overrides_and_name_lookup():
    cfg = presets.preset("usm600m", input_dim=128, chunk_size=200, attention_impl="flex")
    assert (cfg.input_dim, cfg.chunk_size, cfg.attention_impl, cfg.d_model) == (128, 200, "flex", 1024)
    assert presets.preset("tiny") == presets.tiny()
    with pytest.raises(
        ValueError, match=r"'base', 'large', 'nest_large', 'nest_xlarge', 'small', 'tiny', 'usm2b', 'usm600m'"
    ):
        presets.preset("huge")
    with pytest.raises(ValueError, match="unknown ConformerConfig field"):
        presets.small(hidden=3)
    with pytest.raises(ValueError, match="divisible"):
        presets.base(num_heads=7)


@pytest.mark.parametrize("name", ["large", "usm600m", "usm2b"])
def test_eight_x_presets_add_one_conv_stage_and_shrink_the_projection(name):
    """256 channels: + 9 * 256 * 256 + 256 for the third stage, - 256 * (19 - 9) * d_model in the projection."""
    four, eight = presets.preset(name), presets.preset(name, subsampling_factor=8)
    assert (four.subsampling_factor, eight.subsampling_factor) == (4, 8)
    third_stage = 9 * 256 * 256 + 256
    assert _count(eight) - _count(four) == third_stage - 256 * (19 - 9) * eight.d_model
