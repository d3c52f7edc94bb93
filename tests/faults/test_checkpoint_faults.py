"""Faults of checkpoints (usmkit.checkpointing): damaged, altered, symlinked or pickled files, averaging, train state."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from fault_helpers import (
    FAST_TRAIN,
    SR,
    fast_config,
    fast_train,
    metrics,
    one_error_line,
    speechlike,
    worker_config,
)
from safetensors.torch import load_file

import usmkit.cli.evaluate as evaluate_cli
from usmkit.checkpointing import checkpoint as ck
from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.checkpointing.average import average_last
from usmkit.cli.export import main as export_main
from usmkit.cli.transcribe import main as transcribe_main
from usmkit.data.normalize import STATS_FILE
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.runs import load_trained
from usmkit.streaming.pipeline import ModelError, load_model


@pytest.fixture
def wav(tmp_path) -> Path:
    import soundfile as sf

    path = tmp_path / "speech.wav"
    sf.write(path, speechlike(1.5), SR)
    return path


@pytest.fixture
def quiet_logging(monkeypatch):
    """The evaluate command's logging setup replaces the root handlers (pytest's capture among them)."""
    monkeypatch.setattr(evaluate_cli, "setup_logging", lambda *a, **k: None)


def overwrite_middle(path: Path, n: int = 40_000) -> None:
    """Overwrite ``n`` bytes in the middle of ``path``: a safetensors file keeps its header and still parses."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes((b + 1) % 256 for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


def evaluate_cli_run(capsys, exp: Path, corpus: Path, tmp_path: Path) -> tuple[int, str]:
    argv = [f"checkpoint={exp}", f"manifest_dir={corpus}", "test_sets=[test]", f"output={tmp_path / 'eval.json'}"]
    try:
        code = evaluate_cli.main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def transcribe_cli_run(capsys, exp: Path, wav: Path) -> tuple[int, str]:
    code = transcribe_main([str(wav), "--checkpoint", str(exp), "--threads", "1", "--no-partials"])
    return code, capsys.readouterr().err


def export_cli_run(capsys, exp: Path, tmp_path: Path) -> tuple[int, str]:
    try:
        code = export_main([f"checkpoint={exp}", "format=onnx", f"out={tmp_path / 'export'}"])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_damaged_newest_checkpoint_is_rewritten_on_resume(corpus, uninterrupted, tmp_path, caplog):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    newest = exp / "checkpoints" / "step-000006"
    want = {k: v.clone() for k, v in load_file(str(newest / ck.MODEL_FILE)).items()}  # (not the mapped file)
    data = (newest / ck.MODEL_FILE).read_bytes()
    (newest / ck.MODEL_FILE).write_bytes(data[: len(data) // 2])  # truncated, as a full disk or a bad copy leaves it
    caplog.set_level(logging.INFO)
    fast_train(corpus, exp, "resume=true")  # falls back to step 4 and trains steps 5 and 6 again
    assert "falling back to the previous checkpoint" in caplog.text
    assert load_trained(str(exp))[3] == newest  # what evaluation loads, whole again
    got = load_file(str(newest / ck.MODEL_FILE))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), "exact resume"
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 4, 6]
    assert ck.verify_checkpoint(newest)  # sizes and SHA-256 as recorded
    assert f"{newest} is damaged: replacing it with this run's checkpoint of step 6" in caplog.text


def test_altered_weights_that_still_parse_are_refused_wherever_loaded(
    ctc_ckpt, corpus, wav, tmp_path, capsys, quiet_logging
):
    exp = tmp_path / "exp"
    shutil.copytree(ctc_ckpt, exp)
    ckpt = exp / "checkpoints" / "step-000001"
    model_file = ckpt / ck.MODEL_FILE
    overwrite_middle(model_file)
    load_file(str(model_file))  # still a valid safetensors file
    msg = f"{model_file} is damaged: its SHA-256 does not match the one in {ck.STATE_FILE}"

    code, err = evaluate_cli_run(capsys, exp, corpus, tmp_path)
    assert code == 2 and one_error_line(err).startswith(f"error: {msg}")
    code, err = transcribe_cli_run(capsys, exp, wav)
    assert code == 2 and msg in one_error_line(err)
    code, err = export_cli_run(capsys, exp, tmp_path)
    assert code == 2 and msg in one_error_line(err)
    with pytest.raises(ModelError, match=msg):  # the streaming pipeline (usmkit-serve loads through it)
        load_model(exp)
    module = load_trained(str(ctc_ckpt))[0]
    with pytest.raises(ck.CheckpointDamaged, match=msg):  # what init_from= calls
        ck.load_weights(module, ckpt, prefix="encoder.")

    # The recorded size is checked first: a file of another length is named without hashing it.
    (model_file).write_bytes(model_file.read_bytes() + b"\0" * 8)
    with pytest.raises(
        ck.CheckpointDamaged, match=rf"{model_file} is damaged: \d+ bytes where {ck.STATE_FILE} records"
    ):
        ck.load_weights(module, ckpt)


def test_each_file_is_hashed_once_per_load(ctc_ckpt, monkeypatch):
    hashed = []
    real = ck._sha256
    monkeypatch.setattr(ck, "_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    load_trained(str(ctc_ckpt))
    assert sorted(hashed) == [ck.CONFIG_FILE, ck.MODEL_FILE]


def test_averaged_checkpoint_records_and_checks_its_sums(ctc_ckpt, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(ctc_ckpt, exp)
    shutil.copytree(exp / "checkpoints" / "step-000001", exp / "checkpoints" / "step-000002")
    out, steps = average_last(exp, 2)
    assert steps == [1, 2]
    record = json.loads((out / ck.AVERAGE_FILE).read_text())
    assert record["averaged_steps"] == [1, 2] and set(record["sha256"]) == {ck.MODEL_FILE, ck.CONFIG_FILE}
    assert ck.verify_checkpoint(out)
    load_trained(str(out))
    overwrite_middle(out / ck.MODEL_FILE)
    with pytest.raises(ck.CheckpointDamaged, match=rf"{out / ck.MODEL_FILE} is damaged: .* {ck.AVERAGE_FILE}"):
        load_trained(str(out))


def test_symlinked_files_in_an_experiment_are_replaced_not_written_through(corpus, tmp_path):
    from usmkit.training.recipe import TrainingRecipe

    exp = tmp_path / "run"
    exp.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in (TOKENIZER_FILE, STATS_FILE, ck.CONFIG_FILE):
        (elsewhere / name).write_bytes(b"someone else's file")
        (exp / name).symlink_to(elsewhere / name)
    recipe = TrainingRecipe(*fast_config(corpus, exp))
    try:
        recipe.setup_distributed()
        recipe.setup_data()  # copies the tokenizer, statistics and config into exp
    finally:
        recipe.cleanup()
    for name in (TOKENIZER_FILE, STATS_FILE, ck.CONFIG_FILE):
        assert (elsewhere / name).read_bytes() == b"someone else's file", f"{name} was written through its link"
        assert not (exp / name).is_symlink()
    assert Tokenizer.load(exp / TOKENIZER_FILE).model_proto == recipe.tokenizer.model_proto

    link = tmp_path / "link.txt"  # the helper itself
    link.symlink_to(elsewhere / TOKENIZER_FILE)
    with replaced_atomically(link) as tmp:
        tmp.write_text("new")
    assert link.read_text() == "new" and not link.is_symlink()
    assert (elsewhere / TOKENIZER_FILE).read_bytes() == b"someone else's file"


def rewrite(ckpt: Path, name: str, data: bytes) -> None:
    """Replace checkpoint file ``name`` and its recorded size and SHA-256, as a hand edit (or a crafted
    checkpoint) would: what is then refused is the content, not the record."""
    (ckpt / name).write_bytes(data)
    meta = json.loads((ckpt / ck.STATE_FILE).read_text())
    if name in meta["sha256"]:
        meta["sha256"][name] = ck._sha256(ckpt / name)
        meta.setdefault("bytes", {})[name] = len(data)
        (ckpt / ck.STATE_FILE).write_text(json.dumps(meta))


def make_bad(exp: Path, variant: str, marker: Path) -> Path:
    """Damage the copied experiment ``exp`` as ``variant`` says; returns the file that is bad."""
    ckpt = exp / "checkpoints" / "step-000001"
    config = yaml.safe_load((ckpt / ck.CONFIG_FILE).read_text())
    if variant == "yaml_python_tag":
        rewrite(ckpt, ck.CONFIG_FILE, f'!!python/object/apply:os.system ["touch {marker}"]\n'.encode())
        return ckpt / ck.CONFIG_FILE
    if variant == "target_in_model_overrides":
        config["model"]["overrides"] = {"_target_": "os.system", "d_model": 128}
        rewrite(ckpt, ck.CONFIG_FILE, yaml.safe_dump(config).encode())
        return ckpt / ck.CONFIG_FILE
    good_tokenizer = Path(config["tokenizer"]).read_bytes()
    stats = (exp / STATS_FILE).read_bytes()
    bad = {
        "tokenizer_garbage": (TOKENIZER_FILE, os.urandom(5000)),
        "tokenizer_truncated": (TOKENIZER_FILE, good_tokenizer[:1000]),
        "stats_garbage": (STATS_FILE, os.urandom(900)),
        "stats_truncated": (STATS_FILE, stats[:100]),
    }
    name, data = bad[variant]
    (exp / name).write_bytes(data)  # the run's copy, beside its checkpoints: found first
    return exp / name


VARIANTS = [
    "yaml_python_tag",
    "target_in_model_overrides",
    "tokenizer_garbage",
    "tokenizer_truncated",
    "stats_garbage",
    "stats_truncated",
]


@pytest.mark.parametrize("tool", ["evaluate", "transcribe", "export"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_files_in_a_checkpoint_are_one_error_line(
    ctc_ckpt, corpus, wav, tmp_path, capsys, quiet_logging, variant, tool
):
    exp = tmp_path / "exp"
    shutil.copytree(ctc_ckpt, exp)
    marker = tmp_path / "pwned"
    bad = make_bad(exp, variant, marker)
    if tool == "evaluate":
        code, err = evaluate_cli_run(capsys, exp, corpus, tmp_path)
    elif tool == "transcribe":
        code, err = transcribe_cli_run(capsys, exp, wav)
    else:
        code, err = export_cli_run(capsys, exp, tmp_path)
    assert code == 2, err
    assert str(bad) in one_error_line(err)
    assert not marker.exists(), "a checkpoint's config ran code"


@pytest.mark.parametrize("variant", ["tokenizer_garbage", "tokenizer_truncated"])
def test_bad_tokenizer_copy_on_resume_is_one_error_line(corpus, tmp_path, capsys, monkeypatch, variant):
    import usmkit.cli.train as train_cli

    exp = tmp_path / "run"
    exp.mkdir()
    good = (corpus / "tokenizer" / TOKENIZER_FILE).read_bytes()
    (exp / TOKENIZER_FILE).write_bytes(os.urandom(5000) if variant == "tokenizer_garbage" else good[:1000])
    monkeypatch.setattr(train_cli, "setup_logging", lambda *a, **k: None)
    with pytest.raises(SystemExit) as e:
        train_cli.main([*FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "resume=true"])
    assert e.value.code == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {exp / TOKENIZER_FILE} is not a sentencepiece model"
    )
    assert not (exp / "run.lock").exists(), "the lock is released on errors"


def test_damaged_newest_checkpoint_falls_back_with_a_warning(corpus, uninterrupted_workers, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted_workers, exp)
    newest = exp / "checkpoints" / "step-000006" / ck.MODEL_FILE
    data = bytearray(newest.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte inside the weights: still parses, the SHA-256 says otherwise
    newest.write_bytes(bytes(data))
    truncated = exp / "checkpoints" / "step-000004" / ck.STATE_TENSORS_FILE
    truncated.write_bytes(truncated.read_bytes()[:50])
    cfg, yaml_text = worker_config(corpus, exp, "resume=true")
    from usmkit.training.recipe import run

    run(cfg, yaml_text)
    text = caplog.text
    assert f"{newest} is damaged: its SHA-256 does not match" in text and "falling back" in text
    assert f"{truncated} is damaged" in text
    assert "resumed from" in text and "step-000002" in text
    assert metrics(exp) == metrics(uninterrupted_workers), "steps 3..6 redone, each logged once, same losses"


def test_damaged_model_file_is_named(tmp_path):
    import torch

    path = ck.save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {}, "")
    (path / ck.MODEL_FILE).write_bytes(b"\x00" * 16)
    with pytest.raises(ck.CheckpointDamaged, match=rf"{path / ck.MODEL_FILE} is damaged: 16 bytes where"):
        ck.load_weights(torch.nn.Linear(2, 2), path)  # the recorded size, checked first
    with pytest.raises(ck.CheckpointDamaged, match=rf"{path / ck.MODEL_FILE} is damaged or not a safetensors file"):
        ck.load_weights(torch.nn.Linear(2, 2), path, verify=False)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planted_pickle_never_runs(tmp_path):
    import torch

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "exp" / "checkpoints"
    path = ck.save_checkpoint(ckpt, 1, torch.nn.Linear(2, 2), {"step": 1}, "")
    (path / ck.STATE_FILE).unlink()
    (path / ck.STATE_TENSORS_FILE).unlink()
    with open(path / "train_state.pt", "wb") as f:  # an old-style, crafted train state
        pickle.dump({"step": _Payload(marker)}, f)
    with pytest.raises(ck.CheckpointDamaged, match="pickled format, which is not loaded"):
        ck.load_train_state(path)
    assert ck.list_checkpoints(ckpt) == []  # not a resumable checkpoint at all
    # A JSON train state holds data only: nothing in it is called.
    path2 = ck.save_checkpoint(ckpt, 2, torch.nn.Linear(2, 2), {"x": (1, 2.5, None)}, "")
    state_json = json.loads((path2 / ck.STATE_FILE).read_text())
    state_json["state"]["y"] = {"__reduce__": ["os.system", f"touch {marker}"]}
    (path2 / ck.STATE_FILE).write_text(json.dumps(state_json))
    assert ck.load_train_state(path2)["y"] == {"__reduce__": ["os.system", f"touch {marker}"]}
    assert not marker.exists()


def test_train_state_round_trip_types():
    import numpy as np
    import torch

    state = {
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
            "param_groups": [{"lr": 1e-3}],
        },
        "rng": {"python": (3, tuple(range(5)), None), "numpy": ("MT19937", np.arange(4, dtype=np.uint32), 2, 0, 0.0)},
        "nan": float("nan"),
        "__odd": 1,
    }
    tree, tensors = ck.encode_state(state)
    json.dumps(tree)  # JSON-able
    back = ck.decode_state(json.loads(json.dumps(tree)), tensors)
    assert back["optimizer"]["state"][0]["step"].item() == 3.0 and list(back["optimizer"]["state"]) == [0]
    assert back["rng"]["python"] == state["rng"]["python"]
    assert back["rng"]["numpy"][1].dtype == np.uint32 and back["rng"]["numpy"][1].tolist() == [0, 1, 2, 3]
    assert back["nan"] != back["nan"] and back["__odd"] == 1
