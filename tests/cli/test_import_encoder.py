"""``python -m usmkit.cli.import_encoder``: a w2v-BERT 2.0 folder (as transformers' ``save_pretrained`` writes it)
becomes a usmkit experiment whose encoder equals the source, refused with one line where it cannot; then the
recipes start from it (``init_from``)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from import_runs import frozen_import_config, kept_the_import
from safetensors.torch import load_file, save_file

from usmkit.checkpointing.checkpoint import MODEL_FILE, CheckpointDamaged, verify_checkpoint
from usmkit.cli.import_encoder import import_w2vbert, main
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import w2v_bert_2

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # composed_config
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(d_model=32, num_layers=2, num_heads=4, ff_mult=2, conv_kernel=5, relative_left=6, relative_right=3)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A tiny random w2v-BERT 2.0 saved as the hub holds facebook/w2v-bert-2.0 (config, safetensors, extractor)."""
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        feature_projection_input_dim=160, conv_depthwise_kernel_size=5, left_max_position_embeddings=6,
        right_max_position_embeddings=3,
    )  # fmt: skip
    model = transformers.Wav2Vec2BertModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("hub") / "w2v-bert-2.0"
    model.save_pretrained(out)
    transformers.SeamlessM4TFeatureExtractor().save_pretrained(out)
    return out, model


def test_import_writes_a_checkpoint_equal_to_the_source(source, tmp_path, capsys):
    src, model = source
    out = tmp_path / "exp" / "w2vbert"
    assert main([f"source={src}", f"out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "left out: masked_spec_embed" in printed and "model=w2v_bert_2" in printed
    record = json.loads((out / "imported.json").read_text())
    ckpt = out / "checkpoints" / "step-000000"
    assert verify_checkpoint(ckpt)  # sizes and SHA-256 recorded
    assert set(record["source_files"]) == {"config.json", "model.safetensors", "preprocessor_config.json"}
    assert record["skipped_tensors"] == ["masked_spec_embed"]
    cfg = w2v_bert_2(**TINY)
    assert record["encoder"] == {**record["encoder"], **{k: getattr(cfg, k) for k in TINY}}
    assert record["features"]["fbank"] == "seamless_m4t" and record["features"]["normalize"] == "utterance"
    encoder = ConformerEncoder(cfg).eval()
    weights = load_file(ckpt / MODEL_FILE)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items()}, strict=True)
    feats, lens = torch.randn(2, 50, 80), torch.tensor([50, 31])
    mask = (torch.arange(25)[None] < (lens // 2)[:, None]).long()
    with torch.no_grad():
        ref = model(feats.reshape(2, 25, 160), attention_mask=mask).last_hidden_state
        ours, out_lens = encoder(feats, lens)
    assert (ref[0] - ours[0]).abs().max() <= 1e-4 and (ref[1, :15] - ours[1, :15]).abs().max() <= 1e-4
    assert main([f"source={src}", f"out={out}"]) == 0  # an earlier import is replaced
    (ckpt / MODEL_FILE).write_bytes(b"x" + (ckpt / MODEL_FILE).read_bytes()[1:])
    with pytest.raises(CheckpointDamaged, match="model.safetensors is damaged"):
        verify_checkpoint(ckpt)


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_bad_sources_are_refused_with_one_line(source, tmp_path, capsys):
    src, _ = source
    out = tmp_path / "out"

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst

    other = copy("other")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(cfg | {"model_type": "wav2vec2-conformer"}))
    assert "model_type='wav2vec2-conformer'" in _error(capsys, f"source={other}", f"out={out}")

    adapter = copy("adapter")
    (adapter / "config.json").write_text(json.dumps(cfg | {"add_adapter": True}))
    assert "add_adapter=true" in _error(capsys, f"source={adapter}", f"out={out}")

    damaged = copy("damaged")
    data = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "is damaged or not a safetensors file" in _error(capsys, f"source={damaged}", f"out={out}")

    broken = copy("broken")
    (broken / "config.json").write_text('{"model_type": "wav2vec2-bert",')
    assert "config.json is not readable JSON" in _error(capsys, f"source={broken}", f"out={out}")

    extra = copy("extra")
    tensors = load_file(extra / "model.safetensors")
    save_file(tensors | {"encoder.layers.2.ffn1.output_dense.weight": torch.zeros(32, 64)}, extra / "model.safetensors")
    assert "'encoder.layers.2.ffn1.output_dense.weight'" in _error(capsys, f"source={extra}", f"out={out}")

    pickled = copy("pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    assert "pytorch_model.bin is a pickle" in _error(capsys, f"source={pickled}", f"out={out}")

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "corpus.json").write_text("{}")
    assert "not an imported encoder" in _error(capsys, f"source={src}", f"out={corpus}")
    assert not out.exists()  # nothing was written by any refused import
    assert "pass source=DIR and out=DIR" in _error(capsys, f"source={src}")


@pytest.mark.parametrize("recipe", ["stage3_ctc", "stage3_las", "stage2", "stage1"])
def test_recipes_start_from_the_import(source, synth_corpus, tmp_path, recipe):
    """A few steps of a recipe from the import; with the encoder frozen throughout, its weights are the import's."""
    from usmkit.training.recipe import run

    out = tmp_path / "w2vbert"
    import_w2vbert(source[0], out)
    corpus = tmp_path / "corpus"
    shutil.copytree(synth_corpus, corpus)
    exp = tmp_path / "run"
    overrides = "{" + ", ".join(f"{k}: {v}" for k, v in TINY.items()) + "}"
    cfg, yaml = frozen_import_config(recipe, "w2v_bert_2", overrides, out, corpus, exp)
    assert cfg.data.features.fbank == "seamless_m4t" and cfg.model.subsampling_factor == 2
    result = run(cfg, yaml)
    assert result["step"] == 2 and result["bad_steps"] == 0
    assert kept_the_import(out, exp)


@pytest.mark.slow
def test_full_size_import_equals_transformers(tmp_path):
    """A random model of facebook/w2v-bert-2.0's size (transformers' defaults, 580M parameters; ~7 GB of memory),
    saved as the hub holds it: the import needs no model.overrides, and 3 s of features agree within 1e-4."""
    torch.manual_seed(0)
    model = transformers.Wav2Vec2BertModel(transformers.Wav2Vec2BertConfig()).eval()
    src = tmp_path / "w2v-bert-2.0"
    model.save_pretrained(src)
    result = import_w2vbert(src, tmp_path / "exp")
    assert "model.overrides" not in result.record["train"] and result.parameters == 580_590_400
    encoder = ConformerEncoder(w2v_bert_2()).eval()
    weights = load_file(result.checkpoint / MODEL_FILE)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items()}, strict=True)
    feats, lens = torch.randn(2, 300, 80), torch.tensor([300, 211])
    mask = (torch.arange(150)[None] < (lens // 2)[:, None]).long()
    with torch.no_grad():
        ref = model(feats.reshape(2, 150, 160), attention_mask=mask).last_hidden_state
        ours, out_lens = encoder(feats, lens)
    assert max((ref[b, :n] - ours[b, :n]).abs().max() for b, n in enumerate(out_lens.tolist())) <= 1e-4
