"""StopSignals: the first SIGINT or SIGTERM is recorded, a second Ctrl-C stops at once, except torchrun's own
copy of a Ctrl-C, which reaches its workers a moment after the terminal's; a SIGTERM to a training's whole process
group (its loader workers too) saves the step. Through torchrun: tests/training/test_distributed.py."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from usmkit.checkpointing import checkpoint as ck
from usmkit.training import stop_signals
from usmkit.training.stop_signals import StopSignals

REPO = Path(__file__).resolve().parents[2]


def test_the_first_signal_is_recorded_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # a second SIGTERM changes nothing
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_ctrl_c_stops_at_once(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with StopSignals() as stop, pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        assert stop.signum == signal.SIGINT
        signal.raise_signal(signal.SIGINT)


def test_under_torchrun_its_copy_of_the_ctrl_c_is_not_a_second_one(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # torchrun passing the terminal's Ctrl-C on
        assert stop.signum == signal.SIGINT
    monkeypatch.setattr(stop_signals, "FORWARDED_WITHIN_S", 0.0)
    with StopSignals(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # later than a forward: the user pressed Ctrl-C again


class _SignalMidWrite(io.StringIO):
    """A log stream that, like a ``BufferedWriter``, refuses a write begun inside another: its first write sends
    SIGINT to this process, so the signal handler runs while that write is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.armed, self.busy, self.reentered = True, False, False

    def write(self, text: str) -> int:
        if self.busy:
            self.reentered = True
            raise RuntimeError("reentrant call")
        self.busy = True
        try:
            if self.armed:
                self.armed = False
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # Python runs signal handlers between bytecodes
                    pass
            return super().write(text)
        finally:
            self.busy = False


def test_the_signal_notice_never_reenters_a_log_write_it_interrupts(capfd):
    stream = _SignalMidWrite()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with StopSignals() as stop:
            logging.getLogger("usmkit.test").warning("a line being written when Ctrl-C comes")
            assert stop.signum == signal.SIGINT
    finally:
        root.removeHandler(handler)
    assert not stream.reentered and "a line being written" in stream.getvalue()
    err = capfd.readouterr().err
    assert "SIGINT received: finishing this step and saving a checkpoint" in err and "Logging error" not in err


def _losses(exp: Path) -> int:
    metrics = exp / "metrics.jsonl"
    return sum("train/loss" in line for line in metrics.read_text().splitlines()) if metrics.is_file() else 0


def test_sigterm_to_the_process_group_saves_the_step_with_loader_workers(synth_corpus, tmp_path):
    """``kill -TERM -- -PGID`` (what ``timeout`` and schedulers do) reaches the training process and its two
    loader workers: the workers outlive it, the step is saved, and the run ends with one line and 143."""
    exp = tmp_path / "exp"
    cmd = [sys.executable, "-m", "usmkit.cli.train", "recipe=stage3_ctc", "model=tiny",
           "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}", f"data.manifest_dir={synth_corpus}",
           f"trainer.exp_dir={exp}", "data.max_duration=20", "data.num_workers=2", "trainer.device=cpu",
           "trainer.log_every=1", "trainer.progress=false", "trainer.max_steps=1000", "trainer.save_every=0",
           "trainer.eval_every=0"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _losses(exp) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-4000:]
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err[-4000:]
    stopped = re.search(r"error: training stopped by SIGTERM after step (\d+) of 1000, checkpoint saved", err)
    assert stopped and "Traceback" not in err, err[-4000:]
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [int(stopped.group(1))]
