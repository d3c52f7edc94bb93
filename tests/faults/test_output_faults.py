"""Faults of outputs (usmkit.checkpointing.output_dir, the one output guard): no command replaces what it does not own."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from composed_config import train_config
from fault_helpers import (
    FAST_TRAIN,
    SR,
    expect_one_error_line,
    mounted_tmpfs,
    one_error_line,
    run_module,
    speechlike,
)

import usmkit.cli.prepare as prepare_cli
from usmkit.checkpointing import checkpoint as ck
from usmkit.cli.average import main as average_main
from usmkit.cli.export import main as export_main
from usmkit.errors import UsageError


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_outputs_refuse_experiment_checkpoint_and_corpus_folders(uninterrupted, corpus, ctc_ckpt, tmp_path, capsys):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
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


def test_batch_outputs_never_replace_a_file_that_is_not_theirs(ctc_ckpt, tmp_path):
    """``out=notes.txt`` (a file without a newline) was truncated to nothing and filled with transcripts
    (its "cut short last line" dropped); ``ctm=`` set to the input recording replaced the recording, and
    ``ctm=`` equal to ``out=`` replaced the transcripts with the CTM. Each is now one line before any work."""
    import soundfile as sf

    audio = tmp_path / "talk.wav"
    sf.write(audio, speechlike(1.0), SR)
    recording = audio.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, no newline")
    common = [f"checkpoint={ctc_ckpt}", f"inputs={audio}", "num_workers=0"]
    expect_one_error_line(run_module("usmkit.cli.transcribe_batch", *common, f"out={notes}", cwd=tmp_path),
                    "not a transcript file", str(notes))  # fmt: skip
    assert notes.read_text() == "my notes, no newline"

    out = tmp_path / "out.jsonl"
    expect_one_error_line(run_module("usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={audio}", cwd=tmp_path),
                    f"ctm={audio} is also inputs=")  # fmt: skip
    expect_one_error_line(run_module("usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={out}", cwd=tmp_path),
                    f"ctm={out} is also out=")  # fmt: skip
    listed = tmp_path / "list.txt"
    listed.write_text("talk.wav\n")
    proc = run_module("usmkit.cli.transcribe_batch", *common[:1], f"inputs={listed}", f"out={out}", f"ctm={audio}",
                "num_workers=0", cwd=tmp_path)  # fmt: skip
    expect_one_error_line(proc, f"ctm={audio} exists and is not a CTM file")
    assert audio.read_bytes() == recording and not out.exists()

    proc = run_module(
        "usmkit.cli.transcribe_batch", *common, f"out={out}", f"ctm={tmp_path / 'words.ctm'}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    proc = run_module("usmkit.cli.transcribe_batch", *common, f"out={out}", cwd=tmp_path)  # a rerun: its own file
    assert proc.returncode == 0 and len(out.read_text().splitlines()) == 1, proc.stderr.decode()[-3000:]


def _writers(ctc_ckpt: Path, corpus: Path, where: Path, wav: Path) -> dict[str, list[str]]:
    """Each command that writes a folder or a result file, with its output at ``where / <name>``."""
    import soundfile as sf

    sf.write(wav, speechlike(1.0), SR)
    return {
        "train": ["usmkit.cli.train", *FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={where / 'exp'}"],
        "evaluate": ["usmkit.cli.evaluate", f"checkpoint={ctc_ckpt}", f"manifest_dir={corpus}", "test_sets=[dev]",
                     f"output={where / 'eval.json'}"],
        "transcribe": ["usmkit.cli.transcribe", str(wav), "--checkpoint", str(ctc_ckpt), "--step", "eager",
                       "--json", str(where / "talk.json")],
        "average": ["usmkit.cli.average", str(ctc_ckpt), "--last", "1", "--out", str(where / "avg")],
        "prepare": ["usmkit.cli.prepare", "synth", f"out={where / 'corpus'}", "size=tiny"],
        "export": ["usmkit.cli.export", f"checkpoint={ctc_ckpt}", "format=onnx", f"out={where / 'export'}"],
        "transcribe_batch": ["usmkit.cli.transcribe_batch", f"checkpoint={ctc_ckpt}", f"inputs={wav}",
                             f"out={where / 'out.jsonl'}"],
    }  # fmt: skip


def test_outputs_under_a_file_are_one_line_before_any_work(ctc_ckpt, synth_corpus, tmp_path):
    """Training and prepare ended in a NotADirectoryError traceback, batch transcription in FileExistsError;
    evaluate and usmkit-transcribe said one line, but only after decoding everything. Now every command names
    the file in the way before it starts."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for name, argv in _writers(ctc_ckpt, synth_corpus, a_file, tmp_path / "talk.wav").items():
        line = expect_one_error_line(
            run_module(*argv, cwd=tmp_path), f"{a_file} is a file, so nothing can be written under it"
        )
        assert a_file.read_text() == "mine", (name, line)


def test_outputs_on_a_read_only_location_are_one_line_before_any_work(ctc_ckpt, synth_corpus, tmp_path):
    """A read-only mount (root only; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        for argv in _writers(ctc_ckpt, synth_corpus, ro, tmp_path / "talk.wav").values():
            expect_one_error_line(run_module(*argv, cwd=tmp_path), f"{ro} is read-only here")


# ---- trainer.exp_dir pointing at other work ------------------------------------------------------------
def test_exp_dir_that_is_a_checkpoint_corpus_or_file_is_refused_before_anything_is_written(
    ctc_ckpt, synth_corpus, tmp_path
):
    """Training with ``trainer.exp_dir`` set to a checkpoint wrote its config.yaml over the checkpoint's (the
    checkpoint then failed verification) and its logs beside it, exit 0; set to a corpus folder it mixed an
    experiment into the corpus; set to a file it ended in a FileExistsError traceback."""
    exp = tmp_path / "exp"
    shutil.copytree(ctc_ckpt, exp)
    step = exp / "checkpoints" / "step-000001"
    before = {p.name: p.read_bytes() for p in step.iterdir()}
    proc = run_module(
        "usmkit.cli.train", *FAST_TRAIN, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={step}", cwd=tmp_path
    )
    expect_one_error_line(proc, f"trainer.exp_dir={step} is a checkpoint", "choose another trainer.exp_dir")
    assert {p.name: p.read_bytes() for p in step.iterdir()} == before  # no train.log, no config.yaml over its own

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    proc = run_module("usmkit.cli.train", *FAST_TRAIN, f"trainer.exp_dir={a_file}", cwd=tmp_path)
    expect_one_error_line(proc, f"trainer.exp_dir={a_file} exists and is not a folder")
    assert a_file.read_text() == "mine"

    from usmkit.training.recipe import TrainingRecipe

    for other in (synth_corpus, exp / "checkpoints"):  # the library path refuses them too
        cfg, yaml_text = train_config(*FAST_TRAIN, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={other}")
        with pytest.raises(UsageError, match="not an experiment directory"):
            TrainingRecipe(cfg, yaml_text)
    assert not (synth_corpus / "train.log").exists()


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 1024)
        except OSError:
            pass


# ---- result files (evaluate output=, tune_lexicon output=, usmkit-transcribe --json) -------------------
def test_result_files_never_replace_what_is_not_an_earlier_result(ctc_ckpt, tmp_path):
    """``output=``/``--json`` replaced any file silently, exit 0: a checkpoint's model.safetensors, an
    experiment's config.yaml, the recording being transcribed. Now refused before any work, naming the file;
    an earlier result of the same command (or an empty file) is still replaced."""
    import soundfile as sf

    from usmkit.cli import transcribe

    weights = ctc_ckpt / "checkpoints" / "step-000001" / "model.safetensors"
    kept = weights.read_bytes()
    proc = run_module("usmkit.cli.evaluate", f"checkpoint={ctc_ckpt}", f"output={weights}", cwd=tmp_path)
    expect_one_error_line(proc, f"output={weights} exists and is not an evaluation result", "pass a new file name")
    proc = run_module(
        "usmkit.cli.tune_lexicon", f"checkpoint={ctc_ckpt}", f"output={weights.with_name('config.yaml')}", cwd=tmp_path
    )
    expect_one_error_line(proc, "is not a lexicon tuning")
    assert weights.read_bytes() == kept

    audio = tmp_path / "talk.wav"
    sf.write(audio, speechlike(2.0), SR)
    recording = audio.read_bytes()
    argv = [str(audio), "--checkpoint", str(ctc_ckpt), "--step", "eager", "--no-partials"]
    assert transcribe.main([*argv, "--json", str(audio)]) == 2
    assert transcribe.main([*argv, "--json", str(tmp_path)]) == 2  # a folder: one line, not exit 1
    assert audio.read_bytes() == recording
    out = tmp_path / "talk.json"
    out.touch()  # an empty file holds nothing to lose
    assert transcribe.main([*argv, "--json", str(out)]) == 0
    assert transcribe.main([*argv, "--json", str(out)]) == 0  # its own earlier transcript is replaced
    assert "segments" in out.read_text()

    from usmkit.checkpointing.output_dir import check_output_file

    earlier = tmp_path / "eval.json"
    earlier.write_text('{"checkpoint": "x", "decode": "ctc_greedy", "sets": {}}')
    check_output_file(
        earlier, option="output=", own_words="an evaluation result", own_keys=("checkpoint", "decode", "sets")
    )


def test_a_full_disk_at_a_result_file_is_one_line_and_keeps_the_earlier_file(ctc_ckpt, tmp_path, capsys):
    """A full disk when writing ``--json`` left a 0-byte file (the earlier transcript gone) and said
    ``RuntimeError``; evaluate's and tune_lexicon's output, a traceback. A real full tmpfs (root only)."""

    import soundfile as sf
    from fault_helpers import mounted_tmpfs

    from usmkit.cli import transcribe

    with mounted_tmpfs(tmp_path / "small", "size=64k") as mnt:
        _fill(mnt / "fill")
        audio = tmp_path / "talk.wav"
        sf.write(audio, speechlike(2.0), SR)
        out = mnt / "talk.json"
        argv = [str(audio), "--checkpoint", str(ctc_ckpt), "--step", "eager", "--json", str(out)]
        assert transcribe.main(argv) == 1
        err = capsys.readouterr().err
        assert f"could not write --json {out} (the file system holding {mnt} is full" in err, err
        assert not out.exists() and not list(mnt.glob(".tmp-*"))

        from usmkit.checkpointing.atomic import WriteError, write_result_file

        (mnt / "fill").unlink()
        earlier = mnt / "eval.json"
        earlier.write_text('{"checkpoint": "x", "decode": "ctc_greedy", "sets": {}}')
        _fill(mnt / "fill")
        with pytest.raises(WriteError, match=rf"could not write the evaluation result {earlier} \(the file system"):
            write_result_file(earlier, "{" + " " * 100_000 + "}", what="the evaluation result")
        assert earlier.read_text().startswith('{"checkpoint"')
