"""Checkpoints under faults (issue 40): a damaged newest checkpoint rewritten on resume (case 1), outputs that
would replace an experiment or a corpus (2), weights altered but still parseable (4), a symlinked file in
an experiment directory (10), bad config, tokenizer and statistics files in a checkpoint (13)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from fault_helpers import FAST_TRAIN, SR, fast_config, fast_train, speechlike
from safetensors.torch import load_file

import usmkit.cli.evaluate as evaluate_cli
import usmkit.cli.prepare as prepare_cli
from usmkit.checkpointing import checkpoint as ck
from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.checkpointing.average import average_last
from usmkit.cli.average import main as average_main
from usmkit.cli.export import main as export_main
from usmkit.cli.transcribe import main as transcribe_main
from usmkit.data.normalize import STATS_FILE
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.runs import load_trained
from usmkit.streaming.pipeline import ModelError, load_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(synth_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt_faults") / "corpus"
    shutil.copytree(synth_corpus, out)  # training caches features and statistics next to the manifests
    return out


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """A finished run: checkpoints at steps 2, 4 and 6."""
    exp = tmp_path_factory.mktemp("ckpt_faults_run") / "run"
    fast_train(corpus, exp)
    return exp


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


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


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


# ---- case 1 -------------------------------------------------------------------------------------------
def test_case1_damaged_newest_checkpoint_is_rewritten_on_resume(corpus, trained, tmp_path, caplog):
    exp = tmp_path / "run"
    shutil.copytree(trained, exp)
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


# ---- case 2 -------------------------------------------------------------------------------------------
def test_case2_outputs_refuse_experiment_checkpoint_and_corpus_folders(trained, corpus, ctc_ckpt, tmp_path, capsys):
    exp = tmp_path / "run"
    shutil.copytree(trained, exp)
    before = listing(exp)
    for out, what in (
        (exp, "an experiment directory (it has checkpoints/)"),
        (exp / "checkpoints", "a run's checkpoints folder (it has step-000006/)"),
        (exp / "checkpoints" / "step-000004", "a checkpoint (it has model.safetensors)"),
        (corpus, "the corpus folder of synth"),
    ):
        with pytest.raises(SystemExit) as e:
            average_main([str(exp), "--last", "2", "--out", str(out)])
        assert e.value.code == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: --out {out} is {what}")
    assert listing(exp) == before, "nothing in the experiment changed"

    # Its own earlier output is replaced (an average), like any output folder of a tool.
    from usmkit.checkpointing.average import is_average

    out = tmp_path / "avg"
    for _ in range(2):
        assert average_main([str(exp), "--last", "2", "--out", str(out)]) == 0
    assert is_average(out) and (out / ck.AVERAGE_FILE).is_file()
    assert (out.stat().st_mode & 0o777) == 0o755 and (
        exp / "checkpoints" / "step-000006"
    ).stat().st_mode & 0o777 == 0o755
    capsys.readouterr()

    # export: out= an experiment or a corpus folder
    for out in (exp, corpus):
        with pytest.raises(SystemExit) as e:
            export_main([f"checkpoint={ctc_ckpt}", "format=onnx", f"out={out}"])
        assert e.value.code == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: out={out} is ")
    assert listing(exp) == before

    # prepare: a corpus recipe into an experiment, or into another corpus's folder
    for argv, what in (
        (["synth", f"out={exp}", "size=tiny"], "an experiment directory"),
        (["an4", f"out={corpus}", "corpus_dir=/nonexistent"], "the corpus folder of synth"),
    ):
        with pytest.raises(SystemExit) as e:
            prepare_cli.main(argv)
        assert e.value.code == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: out={argv[1][4:]} is {what}")
    assert listing(exp) == before
    # ... but its own corpus folder (rebuilt, or a pool split added to it) is its own output
    prepare_cli.check_out(
        "synth", prepare_cli.importlib.import_module(prepare_cli.CORPORA["synth"]), SimpleNamespace(out=corpus)
    )
    pooled = tmp_path / "an4"
    pooled.mkdir()
    (pooled / "an4_cuts_train.jsonl.gz").write_bytes(b"")
    prepare_cli.check_out("pool", None, SimpleNamespace(out=pooled, corpus="an4"))
    with pytest.raises(UsageError, match="is the corpus folder of an4"):
        prepare_cli.check_out("pool", None, SimpleNamespace(out=pooled, corpus="english"))


# ---- case 4 -------------------------------------------------------------------------------------------
def test_case4_altered_weights_that_still_parse_are_refused_wherever_loaded(
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


def test_case4_each_file_is_hashed_once_per_load(ctc_ckpt, monkeypatch):
    hashed = []
    real = ck._sha256
    monkeypatch.setattr(ck, "_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    load_trained(str(ctc_ckpt))
    assert sorted(hashed) == [ck.CONFIG_FILE, ck.MODEL_FILE]


def test_case4_averaged_checkpoint_records_and_checks_its_sums(ctc_ckpt, tmp_path):
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


# ---- case 10 ------------------------------------------------------------------------------------------
def test_case10_symlinked_files_in_an_experiment_are_replaced_not_written_through(corpus, tmp_path):
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


# ---- case 13 ------------------------------------------------------------------------------------------
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
def test_case13_bad_files_in_a_checkpoint_are_one_error_line(
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
def test_case13_bad_tokenizer_copy_on_resume_is_one_error_line(corpus, tmp_path, capsys, monkeypatch, variant):
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
