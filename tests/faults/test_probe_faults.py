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
