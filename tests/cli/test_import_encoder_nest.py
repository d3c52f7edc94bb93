"""``python -m usmkit.cli.import_encoder source=FILE.nemo``: a NEST archive (a tar of ``model_config.yaml`` and
``model_weights.ckpt``, built here from the NeMo reference of tests/models/nemo_reference.py) becomes a usmkit
experiment whose encoder equals the source; damaged, foreign or unsafe archives are refused with one line; the
recipes start from it."""

from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import yaml
from import_runs import frozen_import_config, kept_the_import
from safetensors.torch import load_file

from tests.models.test_nest import model_config, small_nemo
from usmkit.checkpointing.checkpoint import MODEL_FILE, verify_checkpoint
from usmkit.cli.import_encoder import import_nest, main
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import nest_large

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # composed_config
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(input_dim=80, d_model=32, num_layers=2, num_heads=4, subsampling_channels=8)


def nemo_config() -> dict:
    mc = model_config(layers=2, d_model=32, heads=4, channels=8)
    mc["preprocessor"].update(features=80, sample_rate=16000, window_size=0.025, window_stride=0.01)
    mc["preprocessor"]["normalize"] = "per_feature"
    return mc


def write_nemo(path: Path, members: dict[str, bytes], gz: bool = False) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def nest_members(mc: dict, model) -> dict[str, bytes]:
    """A .nemo's two files: the model's config and state dict (the encoder's and, as NEST's, other modules')."""
    sd = {f"encoder.{k}": v for k, v in model.state_dict().items()}
    sd |= {"preprocessor.featurizer.window": torch.ones(400), "quantizer.codebooks": torch.randn(2, 8, 16)}
    sd |= {"decoder.proj.weight": torch.randn(16, 32), "mask_processor.mask_embedding": torch.zeros(80)}
    return {"./model_config.yaml": yaml.safe_dump(mc).encode(), "./model_weights.ckpt": saved(sd)}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    mc = nemo_config()
    model = small_nemo(mc, seed=7)
    path = tmp_path_factory.mktemp("ngc") / "ssl_en_nest_tiny.nemo"
    return write_nemo(path, nest_members(mc, model), gz=True), model


def test_import_writes_a_checkpoint_equal_to_nemo(source, tmp_path, capsys):
    src, model = source
    out = tmp_path / "exp" / "nest"
    assert main([f"source={src}", f"out={out}"]) == 0
    printed = capsys.readouterr().out
    assert (
        "left out: 4 tensors usmkit's encoder does not use (decoder, mask_processor, preprocessor, quantizer)"
        in printed
    )
    assert "model=nest_large" in printed
    record = json.loads((out / "imported.json").read_text())
    assert record["kind"] == "nest" and set(record["source_files"]) == {src.name}
    assert record["features"]["normalize"] == "utterance" and record["features"]["num_mel_bins"] == 80
    ckpt = out / "checkpoints" / "step-000000"
    assert verify_checkpoint(ckpt)
    cfg = nest_large(**TINY)
    encoder = ConformerEncoder(cfg).eval()
    weights = load_file(ckpt / MODEL_FILE)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items()}, strict=True)
    torch.manual_seed(0)
    feats, lens = torch.randn(2, 90, 80), torch.tensor([90, 41])
    feats[1, 41:] = 0
    with torch.no_grad():
        ref, ref_lens = model(feats.transpose(1, 2), lens)
        ours, out_lens = encoder(feats, lens)
    ref = ref.transpose(1, 2)
    assert out_lens.tolist() == ref_lens.tolist() == [12, 6]
    assert max((ref[b, :n] - ours[b, :n]).abs().max() for b, n in enumerate(out_lens.tolist())) <= 1e-4
    overrides = record["train"].split("model.overrides={")[1].split("}")[0].split(",")
    assert sorted(overrides) == sorted(f"{k}:{v}" for k, v in TINY.items() if k != "input_dim")


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


class Payload:
    """Not a tensor: ``torch.load(weights_only=True)`` must refuse to build it."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_bad_archives_are_refused_with_one_line(source, tmp_path, capsys):
    src, model = source
    out = tmp_path / "out"
    mc = nemo_config()
    members = nest_members(mc, model)

    def nemo(name: str, **changed: bytes | None) -> Path:
        m = {k: v for k, v in (members | changed).items() if v is not None}
        return write_nemo(tmp_path / f"{name}.nemo", m)

    other = json.loads(json.dumps(mc))
    other["encoder"]["self_attention_model"] = "abs_pos"
    bad = nemo("abs", **{"./model_config.yaml": yaml.safe_dump(other).encode()})
    assert "self_attention_model='abs_pos'" in _error(capsys, f"source={bad}", f"out={out}")

    data = src.read_bytes()
    (tmp_path / "cut.nemo").write_bytes(data[: len(data) // 2])
    assert "is damaged" in _error(capsys, f"source={tmp_path / 'cut.nemo'}", f"out={out}")  # cut in the weights
    (tmp_path / "head.nemo").write_bytes(data[:100])
    assert "is damaged or not a .nemo archive" in _error(capsys, f"source={tmp_path / 'head.nemo'}", f"out={out}")

    no_weights = nemo("noweights", **{"./model_weights.ckpt": None})
    assert "has no model_weights.ckpt" in _error(capsys, f"source={no_weights}", f"out={out}")

    outside = nemo("outside", **{"./model_config.yaml": None, "../model_config.yaml": members["./model_config.yaml"]})
    assert "has no model_config.yaml" in _error(capsys, f"source={outside}", f"out={out}")
    assert not (tmp_path.parent / "model_config.yaml").exists()

    pickled = nemo("pickled", **{"./model_weights.ckpt": saved({"encoder.x": Payload()})})
    line = _error(capsys, f"source={pickled}", f"out={out}")
    assert "holds more than tensors" in line and "usmkit loads tensors only" in line

    sd = torch.load(io.BytesIO(members["./model_weights.ckpt"]), weights_only=True)
    extra = nemo("extra", **{"./model_weights.ckpt": saved(sd | {"encoder.layers.5.norm_out.bias": torch.zeros(32)})})
    assert "'encoder.layers.5.norm_out.bias'" in _error(capsys, f"source={extra}", f"out={out}")

    assert "not readable YAML" in _error(
        capsys, f"source={nemo('yaml', **{'./model_config.yaml': b'a: [1,'})}", f"out={out}"
    )
    assert not out.exists()  # nothing was written by any refused import


def test_a_link_member_is_refused(source, tmp_path, capsys):
    path = tmp_path / "link.nemo"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("model_weights.ckpt")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
        data = yaml.safe_dump(nemo_config()).encode()
        info = tarfile.TarInfo("model_config.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert "model_weights.ckpt is not a regular file" in _error(capsys, f"source={path}", f"out={tmp_path / 'o'}")


@pytest.mark.parametrize("recipe", ["stage3_ctc", "stage3_las", "stage2", "stage1"])
def test_recipes_start_from_the_import(source, synth_corpus, tmp_path, recipe):
    """Two steps of a recipe from the import with the encoder frozen: its weights stay the import's."""
    from usmkit.training.recipe import run

    out = tmp_path / "nest"
    import_nest(source[0], out)
    corpus = tmp_path / "corpus"
    shutil.copytree(synth_corpus, corpus)
    exp = tmp_path / "run"
    overrides = "{" + ", ".join(f"{k}: {v}" for k, v in TINY.items() if k != "input_dim") + "}"
    cfg, yaml_text = frozen_import_config(recipe, "nest_large", overrides, out, corpus, exp)
    assert cfg.model.subsampling_factor == 8 and cfg.data.features.normalize == "utterance"
    result = run(cfg, yaml_text)
    assert result["step"] == 2 and result["bad_steps"] == 0
    assert kept_the_import(out, exp)


def test_packed_rows_are_refused_before_training(tmp_path):
    from composed_config import train_config

    from usmkit.config import ConfigError
    from usmkit.training.recipe import check_config

    cfg, _ = train_config(
        "recipe=stage3_ctc", "model=nest_large", "data.pack_to_frames=800", "data.max_cut_duration=8",
        f"trainer.exp_dir={tmp_path}",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="data.pack_to_frames=800: the encoder's dw_striding front end"):
        check_config(cfg)


@pytest.mark.slow
def test_full_size_nest_large_import_equals_reference(tmp_path):
    """A random encoder of NEST large's published shape (17 x 512, 8 heads, 256 subsampling channels, kernel 9) in
    a .nemo: the import needs no model.overrides, and 3 s of features agree with the reference within 1e-4."""
    mc = model_config(layers=17, d_model=512, heads=8, factor=8, channels=256, kernel=9)
    mc["preprocessor"].update(features=80, sample_rate=16000, window_size=0.025, window_stride=0.01)
    model = small_nemo(mc, seed=11)
    src = write_nemo(tmp_path / "ssl_en_nest_large_v1.0.nemo", nest_members(mc, model))
    result = import_nest(src, tmp_path / "exp")
    assert "model.overrides" not in result.record["train"] and result.parameters == 108_744_704
    encoder = ConformerEncoder(nest_large()).eval()
    weights = load_file(result.checkpoint / MODEL_FILE)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items()}, strict=True)
    torch.manual_seed(0)
    feats, lens = torch.randn(2, 300, 80), torch.tensor([300, 211])
    feats[1, 211:] = 0
    with torch.no_grad():
        ref = model(feats.transpose(1, 2), lens)[0].transpose(1, 2)
        ours, out_lens = encoder(feats, lens)
    assert out_lens.tolist() == [38, 27]
    assert max((ref[b, :n] - ours[b, :n]).abs().max() for b, n in enumerate(out_lens.tolist())) <= 1e-4
