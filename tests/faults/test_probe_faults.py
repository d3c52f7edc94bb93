"""Faults found by a second probe of issue 40 ("probed again with cases you were not shown"): work a
command would overwrite or ignore without a word, and user errors that ended in a traceback.

Each test failed on the code before its fix.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from composed_config import train_config
from fault_helpers import FAST_TRAIN

from usmkit.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _run(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``python -m ARGS`` (or a console script's module) as a user runs it, with this tree first on the path."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, timeout=300, input=stdin
    )


def _one_error_line(proc: subprocess.CompletedProcess, *named: str, code: int = 2) -> str:
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == code, err[-3000:]
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for word in named:
        assert word in lines[0], lines[0]
    return lines[0]


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
    proc = _run(
        "usmkit.cli.train", *FAST_TRAIN, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={step}", cwd=tmp_path
    )
    _one_error_line(proc, f"trainer.exp_dir={step} is a checkpoint", "choose another trainer.exp_dir")
    assert {p.name: p.read_bytes() for p in step.iterdir()} == before  # no train.log, no config.yaml over its own

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    proc = _run("usmkit.cli.train", *FAST_TRAIN, f"trainer.exp_dir={a_file}", cwd=tmp_path)
    _one_error_line(proc, f"trainer.exp_dir={a_file} exists and is not a folder")
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
    from fault_helpers import SR, speechlike

    from usmkit.cli import transcribe

    weights = ctc_ckpt / "checkpoints" / "step-000001" / "model.safetensors"
    kept = weights.read_bytes()
    proc = _run("usmkit.cli.evaluate", f"checkpoint={ctc_ckpt}", f"output={weights}", cwd=tmp_path)
    _one_error_line(proc, f"output={weights} exists and is not an evaluation result", "pass a new file name")
    proc = _run(
        "usmkit.cli.tune_lexicon", f"checkpoint={ctc_ckpt}", f"output={weights.with_name('config.yaml')}", cwd=tmp_path
    )
    _one_error_line(proc, "is not a lexicon tuning")
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
    from fault_helpers import SR, mounted_tmpfs, speechlike

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


# ---- a setting ignored without a word ------------------------------------------------------------------
def test_vocab_size_that_the_corpus_tokenizer_does_not_have_is_not_ignored(synth_corpus, tmp_path, caplog):
    """``vocab_size=300`` on a corpus whose shared tokenizer has 512 pieces trained with the 512 pieces,
    exit 0, and recorded ``vocab_size: 300`` in the run's config. Now refused, saying how to get either."""
    from fault_helpers import fast_train

    from usmkit.config import ConfigError

    corpus = Path(shutil.copytree(synth_corpus, tmp_path / "corpus", ignore=shutil.ignore_patterns("feats_*")))
    with pytest.raises(ConfigError) as e:
        fast_train(corpus, tmp_path / "exp", "vocab_size=300")
    assert "vocab_size=300, but the corpus's tokenizer" in str(e.value) and "has 512 pieces" in str(e.value)
    assert "pass vocab_size=512" in str(e.value) and "tokenizer=" in str(e.value)
    assert not (tmp_path / "exp" / "checkpoints").exists()
    with caplog.at_level("WARNING"):  # more than it has: perhaps all the texts allow, so it trains, with a warning
        fast_train(corpus, tmp_path / "exp2", "vocab_size=600", "trainer.max_steps=2")
    assert "has 512 pieces, fewer than vocab_size=600" in caplog.text
