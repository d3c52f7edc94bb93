"""NEST / FastConformer imported into usmkit's encoder: equal in fp32 to NeMo's ``ConformerEncoder``.

``nemo_toolkit`` is not a test dependency (it does not install beside torch 2.11 within CI's limits), so the
reference is ``tests/models/nemo_reference.py``, a transcription of NeMo 3.0.0's encoder forward with its
module names: its state dict has the keys of a real ``.nemo``'s ``model_weights.ckpt``.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.models import nemo_reference
from usmkit.data.packing import Packing
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.nest import ImportRefused, convert_state_dict, encoder_config, resolve, xscale
from usmkit.models.presets import nest_large, nest_xlarge
from usmkit.models.subsampling import dw_striding_lengths
from usmkit.streaming.step import NotStreamableError, check_streamable

TARGET = "nemo.collections.asr.modules.ConformerEncoder"


def model_config(layers=2, d_model=32, heads=4, factor=8, channels=8, kernel=9, norm="batch_norm", xscaling=True):
    """A NEST-style ``model_config.yaml`` (as a dict), with NeMo's interpolation of ``feat_in``."""
    return {
        "sample_rate": 16000,
        "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor", "features": 16},
        "encoder": {
            "_target_": TARGET, "feat_in": "${model.preprocessor.features}", "n_layers": layers, "d_model": d_model,
            "subsampling": "dw_striding", "subsampling_factor": factor, "subsampling_conv_channels": channels,
            "ff_expansion_factor": 4, "self_attention_model": "rel_pos", "n_heads": heads, "att_context_size": [-1, -1],
            "xscaling": xscaling, "untie_biases": True, "pos_emb_max_len": 5000, "conv_kernel_size": kernel,
            "conv_norm_type": norm, "conv_context_size": None, "dropout": 0.1,
        },
    }  # fmt: skip


def small_nemo(mc: dict, seed: int = 0) -> nemo_reference.ConformerEncoder:
    """The reference encoder of ``mc`` (eval), every parameter and batch-norm statistic random."""
    torch.manual_seed(seed)
    e = resolve(mc)["encoder"]
    model = nemo_reference.ConformerEncoder(
        feat_in=e["feat_in"], n_layers=e["n_layers"], d_model=e["d_model"], subsampling_factor=e["subsampling_factor"],
        subsampling_conv_channels=e["subsampling_conv_channels"], n_heads=e["n_heads"], xscaling=e["xscaling"],
        conv_kernel_size=e["conv_kernel_size"], conv_norm_type=e["conv_norm_type"],
    )  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((0.3 if "pre_encode" in name else 0.15) * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.3)
                m.running_var.uniform_(0.3, 2.0)
    return model.eval()


def ours_of(model, mc: dict, **overrides) -> ConformerEncoder:
    cfg = encoder_config(mc, **overrides)
    sd = {f"encoder.{k}": v for k, v in model.state_dict().items()}
    sd["preprocessor.featurizer.fb"] = torch.zeros(1, 16, 257)  # outside the encoder: left out
    converted, skipped = convert_state_dict(sd, cfg, xscale(mc))
    assert skipped == ["preprocessor.featurizer.fb"]
    ours = ConformerEncoder(cfg).eval()
    ours.load_state_dict(converted, strict=True)
    return ours


def feats_and_lengths(seed: int = 1):
    torch.manual_seed(seed)
    lens = torch.tensor([83, 64, 17, 9])
    feats = torch.randn(4, 83, 16)
    feats = feats * (torch.arange(83)[None, :, None] < lens[:, None, None])  # zero padding, as usmkit's batches
    return feats, lens


@pytest.mark.parametrize("impl", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize(
    ("layers", "heads", "factor", "norm"),
    [(1, 2, 8, "batch_norm"), (3, 4, 8, "batch_norm"), (2, 8, 4, "layer_norm"), (2, 4, 8, "layer_norm")],
)
def test_encoder_equals_nemo(impl, layers, heads, factor, norm):
    """A padded batch: every valid frame within 1e-4 of NeMo's output for the batch and for each row alone."""
    mc = model_config(layers=layers, heads=heads, factor=factor, norm=norm)
    model = small_nemo(mc, seed=layers * 10 + heads)
    ours = ours_of(model, mc, attention_impl=impl, dropout=0.0)
    feats, lens = feats_and_lengths()
    with torch.no_grad():
        out, out_lens = ours(feats, lens)
        ref, ref_lens = model(feats.transpose(1, 2), lens)
    ref = ref.transpose(1, 2)  # (B, T', D)
    assert out_lens.tolist() == ref_lens.tolist() == dw_striding_lengths(lens, factor).tolist()
    assert out.shape == ref.shape
    for b, n in enumerate(out_lens.tolist()):
        assert (out[b, :n] - ref[b, :n]).abs().max() <= 1e-4
        with torch.no_grad():
            alone = model(feats[b : b + 1, : lens[b]].transpose(1, 2), lens[b : b + 1])[0].transpose(1, 2)[0]
        assert (out[b, :n] - alone).abs().max() <= 1e-4
        assert out[b, n:].abs().max() == 0 if n < out.shape[1] else True
    assert ref.abs().max() > 0.1  # not a trivially small output


def test_no_xscaling_and_scale_folding():
    """``xscaling: false`` imports with scale 1; with it the projection carries sqrt(d_model)."""
    mc = model_config(xscaling=False)
    assert xscale(mc) == 1.0 and xscale(model_config(d_model=64)) == 8.0
    model = small_nemo(mc)
    ours = ours_of(model, mc, dropout=0.0)
    feats, lens = feats_and_lengths()
    with torch.no_grad():
        out, n = ours(feats, lens)
        ref = model(feats.transpose(1, 2), lens)[0].transpose(1, 2)
    assert (out[0, : n[0]] - ref[0, : n[0]]).abs().max() <= 1e-4


@pytest.mark.parametrize("impl", ["sdpa", "flex"])
def test_chunk_mask_paths_equal_reference(impl):
    """Transformer-XL positions under the chunk-wise mask: SDPA and Flex equal the eager reference."""
    mc = model_config(layers=2, heads=4)
    model = small_nemo(mc, seed=3)
    ref = ours_of(model, mc, attention_impl="reference", dropout=0.0)
    fast = ours_of(model, mc, attention_impl=impl, dropout=0.0)
    feats, lens = feats_and_lengths()
    with torch.no_grad():
        a, _ = ref(feats, lens, chunk_size=3, left_chunks=1)
        b, _ = fast(feats, lens, chunk_size=3, left_chunks=1)
        full, _ = ref(feats, lens)
    assert (a - b).abs().max() <= 1e-5
    assert (a - full).abs().max() > 1e-3  # the mask changed something


def test_output_lengths_match_nemo_formula():
    lens = torch.arange(0, 200)
    for factor in (4, 8):
        stages = int(math.log2(factor))
        expected = nemo_reference.calc_length(lens, 2, 3, 2, False, stages)
        assert dw_striding_lengths(lens, factor).tolist() == expected.tolist()


@pytest.mark.parametrize(("preset", "d_model", "layers"), [(nest_large, 512, 17), (nest_xlarge, 1024, 24)])
def test_full_size_round_trip_on_meta(preset, d_model, layers):
    """The published NEST sizes: every key of NeMo's layout maps onto the preset's encoder, shapes included."""
    mc = model_config(layers=layers, d_model=d_model, heads=8, factor=8, channels=256)
    mc["preprocessor"]["features"] = 80
    with torch.device("meta"):
        model = nemo_reference.ConformerEncoder(
            feat_in=80, n_layers=layers, d_model=d_model, subsampling_conv_channels=256, n_heads=8
        )
        ours = ConformerEncoder(preset())
    cfg = encoder_config(mc, dropout=0.0)
    assert cfg == preset()
    sd = {f"encoder.{k}": v for k, v in model.state_dict().items()}
    assert f"encoder.layers.{layers - 1}.conv.batch_norm.running_var" in sd
    converted, _ = convert_state_dict(sd, cfg, xscale(mc))
    expected = {k: v.shape for k, v in ours.state_dict().items()}
    assert {k: v.shape for k, v in converted.items()} == expected


def refused(mc=None, sd=None, match=""):
    mc = mc or model_config()
    with pytest.raises(ImportRefused, match=match):
        cfg = encoder_config(mc)
        convert_state_dict(sd if sd is not None else {}, cfg)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("subsampling", "striding", "subsampling='striding'"),
        ("self_attention_model", "abs_pos", "self_attention_model='abs_pos'"),
        ("untie_biases", False, "untie_biases=False"),
        ("att_context_size", [70, 13], "att_context_size"),
        ("conv_context_size", "causal", "conv_context_size"),
        ("_target_", "nemo.collections.asr.modules.SqueezeformerEncoder", "SqueezeformerEncoder"),
        ("n_layers", "${model.nope}", "n_layers"),
    ],
)
def test_other_architectures_refused(key, value, match):
    mc = model_config()
    mc["encoder"][key] = value
    refused(mc, match=match)


def test_tensors_unknown_missing_or_misshapen_refused():
    mc = model_config()
    sd = {f"encoder.{k}": v for k, v in small_nemo(mc).state_dict().items()}
    cfg = encoder_config(mc)
    convert_state_dict(sd, cfg)  # the complete one converts
    table = {"encoder.pos_enc.pe": torch.zeros(1, 9999, 32)}  # a stored sinusoid table is recomputed, not loaded
    assert convert_state_dict(sd | table, cfg)[1] == ["encoder.pos_enc.pe"]
    extra = sd | {"encoder.layers.2.norm_out.weight": torch.zeros(32)}
    refused(mc, extra, match=r"encoder.layers.2.norm_out.weight")
    missing = {k: v for k, v in sd.items() if k != "encoder.layers.1.self_attn.pos_bias_v"}
    refused(mc, missing, match=r"no tensor 'encoder.layers.1.self_attn.pos_bias_v'")
    bad = sd | {"encoder.pre_encode.out.weight": torch.zeros(32, 7)}
    refused(mc, bad, match=r"pre_encode.out.weight.*shape \(32, 7\)")


def test_resolve_interpolations():
    cfg = {"a": {"b": 3}, "c": "${model.a.b}", "d": ["${a.b}", "${x.y}"], "e": "text ${a.b}"}
    assert resolve(cfg) == {"a": {"b": 3}, "c": 3, "d": [3, "${x.y}"], "e": "text ${a.b}"}


def test_dw_striding_does_not_stream_or_pack():
    cfg = nest_large(chunk_size=4, left_chunks=2)
    with pytest.raises(NotStreamableError, match="dw_striding"):
        check_streamable(cfg)
    enc = ConformerEncoder(encoder_config(model_config(), dropout=0.0))
    packing = Packing(
        segment_ids=torch.zeros(1, 64, dtype=torch.long), rows=torch.zeros(1, dtype=torch.long),
        offsets=torch.zeros(1, dtype=torch.long), align=8,
    )  # fmt: skip
    with pytest.raises(ValueError, match="pack_to_frames=0"):
        enc.encode_packed(torch.zeros(1, 64, 16), torch.tensor([64]), packing)


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm"])
def test_equals_nemo_itself_when_installed(norm):
    """With ``nemo_toolkit`` importable (not a usmkit dependency: skipped without it), NeMo's own
    ``ConformerEncoder`` has the reference's state-dict keys and shapes, and both it and ours give its output."""
    modules = pytest.importorskip("nemo.collections.asr.modules")
    mc = model_config(layers=2, heads=4, norm=norm)
    e = resolve(mc)["encoder"]
    torch.manual_seed(5)
    nemo = modules.ConformerEncoder(
        feat_in=16, n_layers=2, d_model=32, subsampling="dw_striding", subsampling_factor=8,
        subsampling_conv_channels=8, ff_expansion_factor=4, self_attention_model="rel_pos", n_heads=4,
        conv_kernel_size=9, conv_norm_type=norm, xscaling=True, untie_biases=True, dropout=0.1,
    )  # fmt: skip
    with torch.no_grad():
        for p in nemo.parameters():
            p.add_(0.15 * torch.randn_like(p))
        for m in nemo.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.3)
                m.running_var.uniform_(0.3, 2.0)
    nemo.eval()
    reference = small_nemo(mc)
    reference.load_state_dict(nemo.state_dict(), strict=True)  # the same layout, key for key
    ours = ours_of(nemo, mc, dropout=0.0)
    assert e["conv_norm_type"] == norm
    feats, lens = feats_and_lengths()
    with torch.no_grad():
        theirs, n = nemo(audio_signal=feats.transpose(1, 2), length=lens)
        ref, _ = reference(feats.transpose(1, 2), lens)
        out, out_lens = ours(feats, lens)
    theirs, ref = theirs.transpose(1, 2), ref.transpose(1, 2)
    assert out_lens.tolist() == n.tolist()
    for b, k in enumerate(n.tolist()):
        assert (out[b, :k] - theirs[b, :k]).abs().max() <= 1e-4
        assert (ref[b, :k] - theirs[b, :k]).abs().max() <= 1e-5
