"""Training under faults: kills at any point (also during a checkpoint write), exact resume with the
default augmentation and two loader workers, a full disk, a damaged newest checkpoint, a planted
pickle, hostile manifests, config values refused before any data is read."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from composed_config import train_config
from fault_helpers import mounted_tmpfs

from usmkit.checkpointing import checkpoint as ck
from usmkit.config import ConfigError, TrainConfig
from usmkit.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")  # also what the command line runs with (OMP_NUM_THREADS=1)
FAST = [
    "recipe=stage3_ctc",
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=20",
    "data.num_workers=2",  # several workers, the default augmentation (gain, SpecAugment) on
    "trainer.log_every=1",
    "trainer.progress=false",
    "trainer.eval_every=0",
    "trainer.save_every=2",
    "trainer.max_steps=6",
    "trainer.keep_last=5",
    "optim.warmup_steps=2",
]


@pytest.fixture(scope="module")
def corpus(synth_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_faults") / "corpus"
    shutil.copytree(synth_corpus, out)  # training caches features and statistics next to the manifests
    return out


def config(corpus: Path, exp: Path, *extra: str) -> tuple[TrainConfig, str]:
    return train_config(*FAST, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", *extra)


def train(corpus: Path, exp: Path, *extra: str) -> dict:
    from usmkit.training.recipe import run

    return run(*config(corpus, exp, *extra))


def metrics(exp: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> Path:
    exp = tmp_path_factory.mktemp("runs") / "full"
    train(corpus, exp)
    assert [s for s, _ in metrics(exp)] == [1, 2, 3, 4, 5, 6]
    return exp


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even ``except Exception`` handlers)."""


def kill_at_step(monkeypatch, step: int) -> None:
    """The run dies as it starts computing step ``step`` (after step - 1 was logged)."""
    original = Trainer._forward_backward

    def forward_backward(self, batch, sync):
        if self.step == step - 1:
            raise Killed
        return original(self, batch, sync)

    monkeypatch.setattr(Trainer, "_forward_backward", forward_backward)


def kill_during_checkpoint_write(monkeypatch, step: int) -> None:
    """The run dies while writing checkpoint ``step`` (its weights written, its train state not)."""
    original = ck.save_file

    def save_file(tensors, path, *args, **kwargs):
        if f"step-{step:06d}" in str(path) and path.endswith(ck.STATE_TENSORS_FILE):
            raise Killed
        return original(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", save_file)


@pytest.mark.parametrize("kill", ["after_step_5", "during_checkpoint_4", "after_step_1"])
def test_killed_run_resumes_to_the_same_losses(corpus, uninterrupted, tmp_path, monkeypatch, kill):
    exp = tmp_path / "run"
    with monkeypatch.context() as m:
        if kill == "after_step_5":
            kill_at_step(m, 6)
        elif kill == "after_step_1":
            kill_at_step(m, 2)  # before any checkpoint: resume starts over
        else:
            kill_during_checkpoint_write(m, 4)
        with pytest.raises(Killed):
            train(corpus, exp)
    assert list((exp / "checkpoints").glob(".tmp-*")) == [] or kill == "during_checkpoint_4"
    train(corpus, exp, "resume=true")
    got, want = metrics(exp), metrics(uninterrupted)
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6], "metrics.jsonl holds each step once"
    assert got == want, "the same losses, bit for bit, as the uninterrupted run"
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 4, 6]


@pytest.mark.parametrize("async_save", [True, False], ids=["background_checkpoints", "checkpoints_in_the_loop"])
def test_full_disk_stops_the_run_and_keeps_the_last_checkpoint(corpus, tmp_path, monkeypatch, capsys, async_save):
    """In the loop, the run stops at the save that fails; in the background, at the next step or save (6)."""
    exp = tmp_path / "run"
    original = ck.save_file

    def save_file(tensors, path, *args, **kwargs):
        if "step-000004" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", save_file)
    with pytest.raises(ck.CheckpointWriteError, match=r"holding .*checkpoints is full .*No space left on device") as e:
        train(corpus, exp, f"trainer.async_save={str(async_save).lower()}")
    assert e.value.exit_code == 1 and "step-000004" in str(e.value) and "\n" not in str(e.value)
    logged = [s for s, _ in metrics(exp)]
    if async_save:
        assert logged in ([1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]), "the run stopped by the next save"
    else:
        assert logged == [1, 2, 3, 4], "the run stopped at the failed save"
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2]
    ck.load_train_state(exp / "checkpoints" / "step-000002")  # intact (SHA-256 checked)
    assert not list((exp / "checkpoints").glob(".tmp-*"))


def test_damaged_newest_checkpoint_falls_back_with_a_warning(corpus, uninterrupted, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    newest = exp / "checkpoints" / "step-000006" / ck.MODEL_FILE
    data = bytearray(newest.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte inside the weights: still parses, the SHA-256 says otherwise
    newest.write_bytes(bytes(data))
    truncated = exp / "checkpoints" / "step-000004" / ck.STATE_TENSORS_FILE
    truncated.write_bytes(truncated.read_bytes()[:50])
    cfg, yaml_text = config(corpus, exp, "resume=true")
    from usmkit.training.recipe import run

    run(cfg, yaml_text)
    text = caplog.text
    assert f"{newest} is damaged: its SHA-256 does not match" in text and "falling back" in text
    assert f"{truncated} is damaged" in text
    assert "resumed from" in text and "step-000002" in text
    assert metrics(exp) == metrics(uninterrupted), "steps 3..6 redone, each logged once, same losses"


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


def test_tmpfs_fills_up(tmp_path):
    """A real full file system: a tmpfs with room for one checkpoint (root only; skipped elsewhere)."""
    import torch

    module = torch.nn.Linear(256, 256)
    size = sum(f.stat().st_size for f in ck.save_checkpoint(tmp_path / "probe", 1, module, {}, "").iterdir())
    limit = (size * 3 // 2) // 4096 * 4096 + 8192
    with mounted_tmpfs(tmp_path / "small", f"size={limit}") as mnt:
        first = ck.save_checkpoint(mnt / "checkpoints", 1, module, {}, "")
        with pytest.raises(ck.CheckpointWriteError, match=rf"the file system holding {mnt / 'checkpoints'} is full"):
            ck.save_checkpoint(mnt / "checkpoints", 2, module, {}, "")
        assert [c.step for c in ck.list_checkpoints(mnt / "checkpoints")] == [1]
        ck.load_weights(torch.nn.Linear(256, 256), first)
        assert not list((mnt / "checkpoints").glob(".tmp-*"))


def test_command_source_in_a_training_manifest_never_runs(corpus, tmp_path):
    from usmkit.data.validate import BadInputError

    hostile = tmp_path / "hostile"
    shutil.copytree(corpus, hostile)
    marker = tmp_path / "pwned"
    path = hostile / "synth_cuts_train.jsonl.gz"
    import gzip

    lines = gzip.open(path, "rt").read().splitlines()
    cut = json.loads(lines[3])
    cut["recording"]["sources"] = [{"type": "command", "channels": [0], "source": f"touch {marker}; cat x.wav"}]
    lines[3] = json.dumps(cut)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(BadInputError, match=rf"refused recording source: cut {cut['id']} in .*'command'"):
        train(corpus=hostile, exp=tmp_path / "exp")
    assert not marker.exists()


def test_bad_config_values_are_refused_before_any_data_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"optim.lr must be a positive number, got -0.1"):
        config(tmp_path / "no-corpus", tmp_path / "exp", "optim.lr=-0.1")
    with pytest.raises(ConfigError, match="model: unknown encoder preset 'huge'"):  # not "no cuts manifest"
        train(tmp_path / "no-corpus", tmp_path / "exp", "model.preset=huge")
    with pytest.raises(FileNotFoundError, match="no checkpoint found at"):
        train(tmp_path / "no-corpus", tmp_path / "exp", f"init_from={tmp_path / 'nope'}")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "usmkit.cli.train",
        "recipe=stage3_ctc",
        f"data.manifest_dir={tmp_path}/none",
        "optim.lr=-1",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: optim.lr must be a positive number, got -1.0"
    assert "Traceback" not in proc.stderr  # and no "no cuts manifest" error: no data was looked at


@pytest.mark.slow
def test_debug_flag_shows_the_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "usmkit.cli.train", "recipe=stage3_ctc", "optim.lr=-1", "--debug"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "optim.lr" in proc.stderr


def test_metrics_cut_by_a_kill_mid_line_are_trimmed(tmp_path):
    from usmkit.training.metric_log import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.5}\n{"step": 3, "train/lo')
    assert truncate_metrics(path, 2) == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert truncate_metrics(path, 1) == 1 and truncate_metrics(tmp_path / "absent.jsonl", 0) == 0


def test_resume_with_only_old_pickled_checkpoints_refuses_to_start_over(corpus, uninterrupted, tmp_path):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    for step_dir in (exp / "checkpoints").glob("step-*"):
        (step_dir / ck.STATE_FILE).rename(step_dir / "train_state.pt")
    with pytest.raises(ck.CheckpointError, match=r"none of the 3 checkpoints .* is complete.*init_from="):
        train(corpus, exp, "resume=true")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_a_random_moment_then_resume(corpus, uninterrupted, tmp_path, seed):
    """A real ``kill -9`` of ``python -m usmkit.cli.train`` at a random moment (maybe mid checkpoint write)."""
    import random
    import signal
    import time

    exp = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "usmkit.cli.train", *FAST, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = random.Random(seed).uniform(1.5, 5.5)  # in steps: somewhere between step 2 and step 6
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        done = len(metrics(exp)) if (exp / "metrics.jsonl").is_file() else 0
        if done >= int(target):
            time.sleep((target - int(target)) * 0.5)
            break
        time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run([*cmd, "resume=true"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    assert metrics(exp) == metrics(uninterrupted)
