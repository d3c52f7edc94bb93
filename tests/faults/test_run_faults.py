"""Training runs under faults (issue 40): two runs in one experiment directory (case 7), a full disk at
run start (9), a model too large for the machine's memory (14b)."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from composed_config import train_config
from fault_helpers import FAST_TRAIN, fast_train

from usmkit.checkpointing import checkpoint as ck
from usmkit.config import ConfigError
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.training.recipe import TrainingRecipe

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(synth_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run_faults") / "corpus"
    shutil.copytree(synth_corpus, out)
    return out


# ---- case 7 -------------------------------------------------------------------------------------------
def test_case7_second_run_is_locked_out_and_a_killed_owner_is_taken_over(corpus, tmp_path, caplog):
    exp = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "usmkit.cli.train", *FAST_TRAIN, f"data.manifest_dir={corpus}",
           f"trainer.exp_dir={exp}", "trainer.max_steps=100000"]  # fmt: skip
    owner = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not ck.list_checkpoints(exp / "checkpoints") and owner.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert owner.poll() is None, "the first run ended early"
        with pytest.raises(UsageError) as e:  # before any data is read or anything in exp is written
            fast_train(corpus, exp, "resume=true")
        message = str(e.value)
        assert "\n" not in message and e.value.exit_code == 2
        assert f"{exp} is in use by another training run (pid {owner.pid} on " in message
    finally:
        owner.send_signal(signal.SIGKILL)  # dies holding the lock: its record stays behind
        owner.wait()
    assert json.loads((exp / "run.lock").read_text())["pid"] == owner.pid
    steps = [json.loads(line)["step"] for line in (exp / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps == sorted(steps), "metrics.jsonl holds one run's steps (a checkpoint adds a line at its step)"
    last = ck.latest_checkpoint(exp / "checkpoints").step
    caplog.set_level(logging.WARNING)
    fast_train(corpus, exp, "resume=true", f"trainer.max_steps={last + 1}")
    assert f"names a run that is no longer running (pid {owner.pid} on" in caplog.text
    assert not (exp / "run.lock").exists(), "released when the run ends"


def test_case7_lock_is_released_on_errors_and_a_record_of_another_host_is_refused(corpus, tmp_path):
    from usmkit.training.exp_lock import ExpDirLock, ExpDirLocked

    exp = tmp_path / "run"
    exp.mkdir()
    (exp / TOKENIZER_FILE).write_bytes(b"not a sentencepiece model")
    with pytest.raises(ck.CheckpointError, match="is not a sentencepiece model"):
        fast_train(corpus, exp, "resume=true")  # fails after taking the lock
    assert not (exp / "run.lock").exists()
    lock = ExpDirLock(exp)
    lock.acquire()  # free again
    with pytest.raises(ExpDirLocked, match=rf"pid {os.getpid()} on "):  # and held: a second holder is refused
        ExpDirLock(exp).acquire()
    lock.release()
    (exp / "run.lock").write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": 0}))
    with pytest.raises(
        ExpDirLocked, match=rf"a run on another host \(pid 1 on elsewhere.example.*delete {exp / 'run.lock'}"
    ):
        ExpDirLock(exp).acquire()


# ---- case 9 -------------------------------------------------------------------------------------------
def test_case9_full_disk_at_run_start_loses_nothing_and_resume_works(corpus, tmp_path, monkeypatch):
    exp = tmp_path / "run"
    real = Path.write_bytes

    def half_then_full(self, data):  # the disk fills up half way through the tokenizer's copy
        if self.name.endswith(TOKENIZER_FILE) and self.parent == exp:
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", half_then_full)
        with pytest.raises(UsageError) as e:
            fast_train(corpus, exp)
    message = str(e.value)
    assert "\n" not in message and e.value.exit_code == 1
    assert f"could not write {exp / TOKENIZER_FILE} (the file system holding {exp} is full" in message
    assert "nothing was lost" in message
    assert [p.name for p in exp.iterdir() if TOKENIZER_FILE in p.name] == [], "no half-written copy, no temporary"
    assert not (exp / "run.lock").exists()
    fast_train(corpus, exp, "resume=true", "trainer.max_steps=2")
    Tokenizer.load(exp / TOKENIZER_FILE)


# ---- case 14b -----------------------------------------------------------------------------------------
def test_case14b_model_too_large_for_memory_is_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr("usmkit.training.memory_check.available_cpu_bytes", lambda: 8 * 2**30)
    where = [f"data.manifest_dir={tmp_path / 'no-corpus'}", f"trainer.exp_dir={tmp_path / 'exp'}", "trainer.device=cpu"]
    with pytest.raises(ConfigError) as e:
        TrainingRecipe(*train_config("recipe=stage3_ctc", "model=usm2b", *where))
    message = str(e.value)
    assert "\n" not in message
    m = re.match(r"model=usm2b \(ctc, 1747M parameters\) needs about (\d+\.\d) GiB to train .* but this machine's "
                 r"memory has 8\.0 GiB available", message)  # fmt: skip
    assert m and float(m.group(1)) * 2**30 > 1747e6 * 16, message  # 16 bytes a parameter at least
    assert "smaller model=" in message and "trainer.device=cuda" in message and "trainer.strategy=fsdp" in message
    assert not (tmp_path / "exp").exists()
    TrainingRecipe(*train_config("recipe=stage3_ctc", "model=small", *where))  # fits in the same 8 GiB


def test_case14b_available_memory_is_read_from_the_machine():
    from usmkit.training import memory_check

    available = memory_check.available_cpu_bytes()
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024 if Path("/proc/meminfo").is_file() else None
    assert available is not None and 0 < available and (total is None or available <= total)
