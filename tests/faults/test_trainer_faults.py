"""Faults of training runs (usmkit.training): kills, signals, full disks, the run lock, memory, resume checks."""

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
from fault_helpers import (
    FAST_TRAIN,
    FAST_TRAIN_WORKERS,
    REPO,
    expect_one_error_line,
    fast_config,
    fast_train,
    metrics,
    mounted_tmpfs,
    run_module,
    user_env,
    worker_train,
)

from usmkit.checkpointing import checkpoint as ck
from usmkit.config import ConfigError
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.training.recipe import TrainingRecipe
from usmkit.training.trainer import Trainer


def _signal_during_step(monkeypatch, step: int, signum: int) -> None:
    """The process gets ``signum`` as it starts computing step ``step``."""
    original = Trainer._forward_backward

    def forward_backward(self, batch, sync):
        if self.step == step - 1:
            os.kill(os.getpid(), signum)
        return original(self, batch, sync)

    monkeypatch.setattr(Trainer, "_forward_backward", forward_backward)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_the_step_it_came_in_and_resume_continues_exactly(
    corpus, uninterrupted, tmp_path, monkeypatch, signum
):
    """SIGINT ended training in a KeyboardInterrupt traceback, SIGTERM killed it outright: the steps since
    the last checkpoint were lost. Now the step in progress finishes, is saved, and the run ends with
    ``TrainingInterrupted`` (exit 130 / 143) saying where it saved and how to resume; the handlers in place
    before training are back."""
    from usmkit.training.stop_signals import TrainingInterrupted

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    exp = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_during_step(m, 3, signum)
        with pytest.raises(TrainingInterrupted) as e:
            fast_train(corpus, exp)
    assert e.value.exit_code == 128 + signum
    message = str(e.value)
    assert f"stopped by {signal.Signals(signum).name} after step 3 of 6" in message, message
    assert str(exp / "checkpoints" / "step-000003") in message and "resume=true" in message
    assert {s: signal.getsignal(s) for s in before} == before
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 3]
    fast_train(corpus, exp, "resume=true")
    assert metrics(exp) == metrics(uninterrupted), "the same losses, bit for bit, as the uninterrupted run"


def test_ctrl_c_in_a_terminal_with_loader_workers_is_one_line_and_exit_130(corpus, uninterrupted, tmp_path):
    """A Ctrl-C reaches every process of the terminal's foreground group, the loader's workers too: they
    died with KeyboardInterrupt tracebacks and the trainer with its own. Now the workers ignore it, the
    trainer saves and says so in one line; resume=true ends with the uninterrupted run's losses."""
    exp = tmp_path / "run"
    argv = ["usmkit.cli.train", *FAST_TRAIN, "data.num_workers=2", f"data.manifest_dir={corpus}"]
    argv += [f"trainer.exp_dir={exp}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv], cwd=tmp_path, env=user_env(tmp_path), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (exp / "metrics.jsonl").is_file() and metrics(exp):
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the trainer and its workers
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=240)
    proc.stderr = err
    line = expect_one_error_line(proc, "stopped by SIGINT after step", "resume=true", code=130)
    assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode(), err.decode()[-3000:]
    saved = [c.step for c in ck.list_checkpoints(exp / "checkpoints")]
    assert saved and f"step-{saved[-1]:06d}" in line
    assert run_module(*argv, "resume=true", cwd=tmp_path).returncode == 0
    assert metrics(exp) == metrics(uninterrupted)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.overrides={d_model: 32, num_layers: 2, num_heads: 2}", "model.overrides.d_model was 64"),
        ("task.kind=las", "task.kind was ctc"),
        ("vocab_size=300", "vocab_size was 512"),
        ("data.features.num_mel_bins=64", "data.features.num_mel_bins was 80"),
    ],
)
def test_resume_with_a_changed_model_task_or_vocab_is_refused_before_anything_is_written(
    uninterrupted, corpus, tmp_path, override, named
):
    """A changed model size or feature count failed with "does not fit this model" only after the data was
    prepared, having overwritten the run's config.yaml and statistics with the new settings' ones; a changed
    vocab_size was ignored (the run's tokenizer copy was used) and recorded in config.yaml as if it had
    applied. Now one line names the key, its saved and its new value, and the folder is as it was."""
    from usmkit.config import ConfigError

    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    before = {p: p.read_bytes() for p in exp.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="resume=true, but ") as e:
        fast_train(corpus, exp, "resume=true", override)
    assert named in str(e.value) and "start a new run in another trainer.exp_dir" in str(e.value), str(e.value)
    assert {p: p.read_bytes() for p in exp.rglob("*") if p.is_file()} == before


def test_resume_with_changed_harmless_keys_still_runs(uninterrupted, corpus, tmp_path):
    """More steps, a longer schedule, other workers and log intervals, features computed on the fly instead
    of stored: the run resumes."""
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    extra = ["trainer.max_steps=7", "optim.warmup_steps=3", "data.num_workers=0", "trainer.log_every=2",
             "data.features.precomputed=false"]  # fmt: skip
    assert fast_train(corpus, exp, "resume=true", *extra)["step"] == 7


def test_resume_refusal_on_the_command_line_writes_nothing(uninterrupted, corpus, tmp_path):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted, exp)
    before = sorted(p.relative_to(exp) for p in exp.rglob("*"))
    argv = [*FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "resume=true", "model=small"]
    expect_one_error_line(
        run_module("usmkit.cli.train", *argv, cwd=tmp_path), "model.preset was tiny", "and is small now"
    )
    assert sorted(p.relative_to(exp) for p in exp.rglob("*")) == before  # not even a train.log


def test_resume_normalizes_with_the_runs_own_statistics_not_the_corpus_file(uninterrupted, corpus, tmp_path):
    """A resumed run read the corpus's ``feature_stats`` file, which another run (another sample of cuts, a
    changed corpus) may have recomputed since, trained on with features normalized differently from the
    steps before, and replaced the run's own copy with it. Now it keeps the copy it started with."""
    from usmkit.data.normalize import STATS_FILE, FeatureStats, stats_path
    from usmkit.training.recipe import TrainingRecipe

    changed_corpus = Path(shutil.copytree(corpus, tmp_path / "corpus"))
    exp = Path(shutil.copytree(uninterrupted, tmp_path / "run"))
    own = (exp / STATS_FILE).read_bytes()
    cfg, yaml_text = fast_config(changed_corpus, exp, "resume=true", "trainer.max_steps=7")
    corpus_file = stats_path(cfg.data.manifest_dir, cfg.data.features.sample_rate)
    recomputed = FeatureStats.load(corpus_file)
    FeatureStats(mean=recomputed.mean + 1.0, std=recomputed.std * 2.0).save(corpus_file, cfg.data.features)

    TrainingRecipe(cfg, yaml_text).run()
    assert (exp / STATS_FILE).read_bytes() == own, "the run's copy was replaced by the corpus's new file"


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


def test_second_run_is_locked_out_and_a_killed_owner_is_taken_over(corpus, tmp_path, caplog):
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


def test_lock_is_released_on_errors_and_a_record_of_another_host_is_refused(corpus, tmp_path):
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


def test_full_disk_at_run_start_loses_nothing_and_resume_works(corpus, tmp_path, monkeypatch):
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


def test_model_too_large_for_memory_is_refused_before_any_data(tmp_path, monkeypatch):
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


def test_available_memory_is_read_from_the_machine():
    from usmkit.training import memory_check

    available = memory_check.available_cpu_bytes()
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024 if Path("/proc/meminfo").is_file() else None
    assert available is not None and 0 < available and (total is None or available <= total)


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
def test_killed_run_resumes_to_the_same_losses(corpus, uninterrupted_workers, tmp_path, monkeypatch, kill):
    exp = tmp_path / "run"
    with monkeypatch.context() as m:
        if kill == "after_step_5":
            kill_at_step(m, 6)
        elif kill == "after_step_1":
            kill_at_step(m, 2)  # before any checkpoint: resume starts over
        else:
            kill_during_checkpoint_write(m, 4)
        with pytest.raises(Killed):
            worker_train(corpus, exp)
    assert list((exp / "checkpoints").glob(".tmp-*")) == [] or kill == "during_checkpoint_4"
    worker_train(corpus, exp, "resume=true")
    got, want = metrics(exp), metrics(uninterrupted_workers)
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6], "metrics.jsonl holds each step once"
    assert got == want, "the same losses, bit for bit, as the uninterrupted_workers run"
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
        worker_train(corpus, exp, f"trainer.async_save={str(async_save).lower()}")
    assert e.value.exit_code == 1 and "step-000004" in str(e.value) and "\n" not in str(e.value)
    logged = [s for s, _ in metrics(exp)]
    if async_save:
        assert logged in ([1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]), "the run stopped by the next save"
    else:
        assert logged == [1, 2, 3, 4], "the run stopped at the failed save"
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2]
    ck.load_train_state(exp / "checkpoints" / "step-000002")  # intact (SHA-256 checked)
    assert not list((exp / "checkpoints").glob(".tmp-*"))


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
        worker_train(corpus=hostile, exp=tmp_path / "exp")
    assert not marker.exists()


def test_metrics_cut_by_a_kill_mid_line_are_trimmed(tmp_path):
    from usmkit.training.metric_log import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.5}\n{"step": 3, "train/lo')
    assert truncate_metrics(path, 2) == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert truncate_metrics(path, 1) == 1 and truncate_metrics(tmp_path / "absent.jsonl", 0) == 0


def test_resume_with_only_old_pickled_checkpoints_refuses_to_start_over(corpus, uninterrupted_workers, tmp_path):
    exp = tmp_path / "run"
    shutil.copytree(uninterrupted_workers, exp)
    for step_dir in (exp / "checkpoints").glob("step-*"):
        (step_dir / ck.STATE_FILE).rename(step_dir / "train_state.pt")
    with pytest.raises(ck.CheckpointError, match=r"none of the 3 checkpoints .* is complete.*init_from="):
        worker_train(corpus, exp, "resume=true")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_a_random_moment_then_resume(corpus, uninterrupted_workers, tmp_path, seed):
    """A real ``kill -9`` of ``python -m usmkit.cli.train`` at a random moment (maybe mid checkpoint write)."""
    import random
    import signal
    import time

    exp = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "usmkit.cli.train",
        *FAST_TRAIN_WORKERS,
        f"data.manifest_dir={corpus}",
        f"trainer.exp_dir={exp}",
    ]
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
    assert metrics(exp) == metrics(uninterrupted_workers)
