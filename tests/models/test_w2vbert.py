"""w2v-BERT 2.0 imported into usmkit's encoder: equal to transformers' ``Wav2Vec2BertModel`` (the reference
implementation) in fp32, on every attention path that takes its relative-position bias."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from usmkit.kernels.chunk_attention.api import chunk_attention
from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.w2vbert import ImportRefused, convert_state_dict, encoder_config

transformers = pytest.importorskip("transformers")

FULL_CONFIG = Path(__file__).parent / "data" / "w2v-bert-2.0-config.json"


def small_hf(layers: int = 2, heads: int = 4, seed: int = 0, **extra):
    """A random ``Wav2Vec2BertModel`` (eval) whose every parameter is random, norms and biases included."""
    torch.manual_seed(seed)
    cfg = transformers.Wav2Vec2BertConfig(
        hidden_size=8 * heads, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=16 * heads,
        feature_projection_input_dim=16, conv_depthwise_kernel_size=5, left_max_position_embeddings=6,
        right_max_position_embeddings=3, **extra,
    )  # fmt: skip
    model = transformers.Wav2Vec2BertModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return cfg, model


def hf_and_ours(model, cfg: ConformerConfig, feats: torch.Tensor, lens: torch.Tensor):
    """(reference output, ours, our output lengths) of 80-bin-style features (B, T, F) with lengths (B,)."""
    B, T, F = feats.shape
    stacked = feats[:, : T // 2 * 2].reshape(B, T // 2, 2 * F)  # what SeamlessM4TFeatureExtractor hands the model
    mask = (torch.arange(T // 2)[None] < (lens // 2)[:, None]).long()
    ours = ConformerEncoder(cfg).eval()
    ours.load_state_dict(convert_state_dict(model.state_dict(), cfg)[0], strict=True)
    with torch.no_grad():
        ref = model(stacked, attention_mask=mask).last_hidden_state
        out, out_lens = ours(feats, lens)
    return ref, out, out_lens


@pytest.mark.parametrize("impl", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize(("layers", "heads"), [(1, 2), (3, 4)])
def test_encoder_equals_transformers(impl, layers, heads):
    """Padding in the batch (odd lengths too): every valid frame within 1e-4 of ``last_hidden_state``."""
    hf_cfg, model = small_hf(layers, heads, seed=layers * 10 + heads)
    cfg = encoder_config(hf_cfg.to_dict(), attention_impl=impl)
    feats, lens = torch.randn(3, 41, 8), torch.tensor([41, 30, 9])
    ref, out, out_lens = hf_and_ours(model, cfg, feats, lens)
    assert out_lens.tolist() == [20, 15, 4]
    for b in range(3):
        n = int(out_lens[b])
        assert (ref[b, :n] - out[b, :n]).abs().max() <= 1e-4
        assert (out[b, n:] == 0).all()  # padding is 0 in usmkit's output


def test_long_utterance_clips_distances():
    """Longer than the clip window both ways (left 6, right 3): the clipped entries are used, and still equal."""
    hf_cfg, model = small_hf(2, 2, seed=3)
    cfg = encoder_config(hf_cfg.to_dict())
    feats, lens = torch.randn(2, 64, 8), torch.tensor([64, 50])
    ref, out, out_lens = hf_and_ours(model, cfg, feats, lens)
    assert (ref[0] - out[0]).abs().max() <= 1e-4
    assert (ref[1, :25] - out[1, :25]).abs().max() <= 1e-4


def test_bias_under_chunk_mask_same_on_every_path():
    """The chunk-wise mask with the bias: SDPA (float mask) and Flex (score_mod) equal the reference."""
    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 37, 8
    q, k, v = (torch.randn(B, H, T, Dh) for _ in range(3))
    bias = RelativeKeyBias(torch.randn(B, H, T, 5 + 2 + 1), left=5, right=2)
    lens = torch.tensor([37, 22])
    for chunk, left in [(None, 0), (4, 0), (4, 2), (6, -1)]:
        ref = chunk_attention(q, k, v, lens, chunk, left, impl="reference", bias=bias)
        for impl in ("sdpa", "flex"):
            out = chunk_attention(q, k, v, lens, chunk, left, impl=impl, bias=bias)
            assert (out - ref).abs().max() <= 1e-5, (impl, chunk, left)
        plain = chunk_attention(q, k, v, lens, chunk, left, impl="reference")
        assert (plain - ref).abs().max() > 1e-3  # the bias changes the result


def test_bias_matches_its_definition():
    table = torch.randn(1, 1, 4, 3 + 1 + 1)
    bias = RelativeKeyBias(table, left=3, right=1, key_offset=2).dense(6)  # keys 0..5, queries at keys 2..5
    for i in range(4):
        for j in range(6):
            d = max(-3, min(1, j - (i + 2)))
            assert bias[0, 0, i, j] == table[0, 0, i, d + 3]


def test_triton_refuses_the_bias():
    hf_cfg, _ = small_hf(1, 2)
    with pytest.raises(ImportRefused, match="rotary positions only"):
        encoder_config(hf_cfg.to_dict(), attention_impl="triton")
    q = torch.randn(1, 1, 4, 8)
    bias = RelativeKeyBias(torch.zeros(1, 1, 4, 3), left=1, right=1)
    with pytest.raises(ValueError, match="rotary positions only"):
        chunk_attention(q, q, q, torch.tensor([4]), None, 0, impl="triton", bias=bias)


def test_full_size_round_trips_on_meta():
    """facebook/w2v-bert-2.0's config (transformers' defaults): every source key maps, every shape fits."""
    hf_dict = json.loads(FULL_CONFIG.read_text())
    cfg = encoder_config(hf_dict)
    assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.ff_mult, cfg.conv_kernel) == (1024, 24, 16, 4, 31)
    assert (cfg.input_dim, cfg.subsampling_factor, cfg.relative_left, cfg.relative_right) == (80, 2, 64, 8)
    with torch.device("meta"):
        model = transformers.Wav2Vec2BertModel(transformers.Wav2Vec2BertConfig(**hf_dict))
        ours = ConformerEncoder(cfg)
    source = model.state_dict()
    converted, skipped = convert_state_dict(source, cfg)
    assert skipped == ["masked_spec_embed"]
    expected = ours.state_dict()
    assert set(converted) == set(expected)
    assert all(converted[k].shape == expected[k].shape for k in expected)
    n = sum(t.numel() for k, t in source.items() if k not in skipped)
    assert 580e6 < n < 600e6  # the 0.6B encoder
    ours.load_state_dict(converted, strict=True, assign=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "wav2vec2-conformer"}, "model_type='wav2vec2-conformer'"),
        ({"position_embeddings_type": "rotary"}, "position_embeddings_type='rotary'"),
        ({"add_adapter": True}, "add_adapter=true"),
        ({"hidden_act": "tanh"}, "hidden_act='tanh'"),
        ({"intermediate_size": 100}, "intermediate_size=100"),
    ],
)
def test_config_refused(change, message):
    hf_dict = json.loads(FULL_CONFIG.read_text()) | change
    with pytest.raises(ImportRefused, match=message):
        encoder_config(hf_dict)


def test_state_dict_refused():
    """A key the encoder lacks, a missing key and a wrong shape are each named."""
    hf_cfg, model = small_hf(1, 2)
    cfg = encoder_config(hf_cfg.to_dict())
    sd = model.state_dict()
    with pytest.raises(ImportRefused, match="'encoder.layers.1.ffn1.output_dense.weight'"):
        convert_state_dict(sd | {"encoder.layers.1.ffn1.output_dense.weight": torch.zeros(1)}, cfg)
    missing = {k: v for k, v in sd.items() if k != "encoder.layers.0.self_attn.linear_k.bias"}
    with pytest.raises(ImportRefused, match="no tensor 'encoder.layers.0.self_attn.linear_k.bias'"):
        convert_state_dict(missing, cfg)
    bad = sd | {"feature_projection.projection.weight": torch.zeros(16, 3)}
    with pytest.raises(ImportRefused, match=r"'feature_projection.projection.weight' has shape \(16, 3\)"):
        convert_state_dict(bad, cfg)
    prefixed = {"wav2vec2_bert." + k: v for k, v in sd.items()}  # from a transformers head model
    assert set(convert_state_dict(prefixed, cfg)[0]) == set(convert_state_dict(sd, cfg)[0])
