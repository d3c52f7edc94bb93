"""Several processes on the CPU (gloo): no hang, ever silent.

Spawned processes (fast): rank-0-first preparation waits past the training timeout, and a failure on any
rank fails every rank; a collective that stalls in the training loop fails within ``trainer.dist_timeout_s``
naming the rank and the operation, the last checkpoint intact. Through torchrun: a killed rank is named in one
error line. Through torchrun (slow): a run on a fresh
corpus copy (no tokenizer, no stored features) with rank 1 arriving late finishes; a stalled rank fails the
run; every rank exits promptly after its last step with loader workers; an elastic restart resumes by
itself; two agents of a c10d rendezvous train as one two-process launch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import dist_helpers
import pytest
import torch.multiprocessing as mp

from usmkit.checkpointing import checkpoint as ck

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("dist_harness.py")
FAST = [
    "recipe=stage3_ctc",
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=20",
    "data.num_workers=0",
    "trainer.device=cpu",
    "trainer.log_every=1",
    "trainer.progress=false",
    "optim.warmup_steps=2",
    "optim.schedule=constant",
]
LIMIT_S = 420  # a run that has not ended by then hangs


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, out: Path, scenario: str, world: int = 2, **options) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    # Forked rather than spawned: the children skip importing torch and usmkit again (seconds each).
    mp.start_processes(fn, args=(world, _port(), str(out), scenario, options), nprocs=world, start_method="fork")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


# ---------------------------------------------------------------- spawned processes (fast)
def test_rank0_first_waits_for_a_preparation_longer_than_the_training_timeout(tmp_path):
    """Rank 0 prepares for 3 s with dist_timeout_s=1: rank 1 waits on the host group (rank0_timeout_s) and
    then reads what rank 0 wrote."""
    got = _spawn(dist_helpers.rank0_first_worker, tmp_path, "slow", dist_timeout_s=1.0, prepare_s=3.0)
    assert got[0]["result"] == "prepared", got[0]
    assert got[1]["result"].startswith("written at"), got[1]
    assert got[1]["seconds"] >= 3.0


@pytest.mark.parametrize("scenario", ["rank0_fails", "rank1_fails"])
def test_a_failed_preparation_fails_every_rank(tmp_path, scenario):
    """Rank 0 failing fails rank 1 before it starts (it would find nothing prepared); rank 1 failing fails
    rank 0 too. Each names who failed; nobody waits for rank0_timeout_s (60 s here)."""
    got = _spawn(dist_helpers.rank0_first_worker, tmp_path, scenario)
    failing, other = (0, 1) if scenario == "rank0_fails" else (1, 0)
    assert got[failing]["error"] == "ValueError", got[failing]
    assert got[other]["error"] == "OtherRankFailed", got[other]
    assert f"{failing} failed at the test's preparation" in got[other]["message"].replace("[", "").replace("]", "")
    assert all(g["seconds"] < 30 for g in got)


def test_a_stalled_collective_in_training_fails_naming_the_rank_and_the_operation(tmp_path):
    """Rank 1's batch of step 3 takes 6 s; rank 0 waits in step 3's gradient all-reduce and fails after
    dist_timeout_s=2 with an error naming itself and that operation. The checkpoint of step 2 is complete."""
    got = _spawn(dist_helpers.stalled_step_worker, tmp_path, "stall", dist_timeout_s=2.0, stall_s=6.0)
    assert got[0]["error"] == "CollectiveError", got[0]
    message = got[0]["message"]
    assert message.startswith("rank 0 of 2: step 3's forward and backward (DDP's gradient all-reduce)"), message
    assert "trainer.dist_timeout_s=2 s" in message and "resume=true" in message
    assert got[0]["seconds"] < 6  # it did not wait for rank 1
    assert got[1]["error"] == "CollectiveError", got[1]  # rank 1 finds rank 0 gone
    assert got[1]["message"].startswith("rank 1 of 2: step 3's forward and backward"), got[1]
    assert [c.step for c in ck.list_checkpoints(tmp_path / "exp" / "checkpoints")] == [2]
    ck.load_train_state(tmp_path / "exp" / "checkpoints" / "step-000002")  # complete: every SHA-256 matches


def test_background_checkpoints_of_rank0_equal_those_written_in_the_loop(tmp_path):
    """DDP with rank 0 writing in the background: both ranks end, and the checkpoints are those of the
    same run written in the loop, byte for byte."""
    runs = {s: _spawn(dist_helpers.background_checkpoint_worker, tmp_path / s, s) for s in ("async", "in_the_loop")}
    for scenario, got in runs.items():
        assert [g.get("result") for g in got] == [6, 6], (scenario, got)
    folders = {s: tmp_path / s / "exp" / "checkpoints" for s in runs}
    assert [c.step for c in ck.list_checkpoints(folders["async"])] == [2, 4, 6]
    for step in (2, 4, 6):
        a, b = (folders[s] / f"step-{step:06d}" for s in runs)
        assert ck.verify_checkpoint(a)
        assert {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


def test_a_failed_background_write_on_rank0_stops_every_rank(tmp_path):
    """Rank 0's disk is full at the checkpoint of step 4, written in the background: both ranks stop with
    rank 0's one-line CheckpointWriteError (rank 1 learns it from rank 0), and step 2's checkpoint is intact."""
    got = _spawn(dist_helpers.background_checkpoint_worker, tmp_path, "full_disk")
    assert [g.get("error") for g in got] == ["CheckpointWriteError", "CheckpointWriteError"], got
    message = got[0]["message"]
    assert message.startswith("step 4's checkpoint, written in the background, failed: could not write checkpoint")
    assert "No space left on device" in message and "resume=true" in message and "\n" not in message
    assert got[1]["message"] == message
    assert [c.step for c in ck.list_checkpoints(tmp_path / "exp" / "checkpoints")] == [2]
    ck.load_train_state(tmp_path / "exp" / "checkpoints" / "step-000002")


# ---------------------------------------------------------------- torchrun (slow)
def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env | extra


def _torchrun(cwd: Path, *overrides: str, nproc: int = 2, launcher=(), env=None) -> subprocess.CompletedProcess:
    """``torchrun --standalone`` of the harness (``python -m usmkit.cli.train`` with faults put in)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *(launcher or ["--standalone"]), "--nproc-per-node",
           str(nproc), str(HARNESS), *FAST, *overrides]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every process it started
        out, err = proc.communicate()
        raise AssertionError(f"the run did not end within {LIMIT_S} s:\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _fresh_copy(corpus: Path, tmp_path: Path) -> Path:
    """The corpus without its tokenizer and stored features: rank 0 trains the one and computes the other."""
    copy = Path(shutil.copytree(corpus, tmp_path / "corpus", ignore=shutil.ignore_patterns("tokenizer*", "feats_*")))
    assert not (copy / "tokenizer").exists()
    return copy


def _losses(exp: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.slow  # ~40 s
def test_fresh_caches_with_rank1_arriving_late_train_and_end(synth_corpus, tmp_path):
    """No tokenizer, no stored features, and rank 1 starts its setup 3 s late: the tokenizer rank 0 trains
    is then on disk when rank 1 looks for it. Every collective must still pair with the same one on rank 0
    (a barrier taken only where the file was missing hung both in DDP's parameter check)."""
    corpus, exp = _fresh_copy(synth_corpus, tmp_path), tmp_path / "exp"
    proc = _torchrun(
        tmp_path, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "vocab_size=300",
        "data.features.precomputed=true", "data.speed_perturb=[]", "trainer.max_steps=3", "trainer.save_every=3",
        "trainer.eval_every=3", "trainer.dev_max_batches=1", env=_env(HARNESS_DELAY_RANK1_S="3"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (corpus / "tokenizer" / "tokenizer.model").is_file() and (corpus / "feats_train").is_dir()
    assert proc.stdout.count("training one") == 1  # rank 0 alone trained the tokenizer
    assert sorted(_losses(exp)) == [1, 2, 3] and "done:" in proc.stdout
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [3]


@pytest.mark.slow  # ~40 s
def test_a_slow_preparation_on_rank0_does_not_trip_the_training_timeout(synth_corpus, tmp_path):
    """Rank 0 loads the tokenizer 12 s late with trainer.dist_timeout_s=8: rank 1 waits for it on the host
    group, and the run trains."""
    exp = tmp_path / "exp"
    proc = _torchrun(
        tmp_path, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.max_steps=2",
        "trainer.eval_every=0", "trainer.dist_timeout_s=8", env=_env(HARNESS_SLOW_PREPARE_RANK0_S="12"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert sorted(_losses(exp)) == [1, 2]


@pytest.mark.slow  # ~40 s
def test_torchrun_a_stalled_rank_fails_the_run_loudly(synth_corpus, tmp_path):
    """Rank 1 stops before step 3 (it sleeps an hour): rank 0 fails within trainer.dist_timeout_s with one
    line naming itself and the operation, torchrun ends rank 1, and the checkpoint of step 2 is complete."""
    exp = tmp_path / "exp"
    start = time.monotonic()
    proc = _torchrun(
        tmp_path, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.max_steps=6",
        "trainer.save_every=2", "trainer.eval_every=0", "trainer.dist_timeout_s=10",
        env=_env(HARNESS_STALL_RANK1_AT_STEP="3"),
    )  # fmt: skip
    assert proc.returncode != 0 and time.monotonic() - start < 300
    assert re.search(r"error: rank 0 of 2: step 3's forward and backward \(DDP's gradient all-reduce\) did not "
                     r"complete .*trainer\.dist_timeout_s=10 s", proc.stderr), proc.stderr[-4000:]  # fmt: skip
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2]
    ck.load_train_state(exp / "checkpoints" / "step-000002")


@pytest.mark.slow  # ~35 s
def test_torchrun_a_killed_rank_is_named_in_one_error_line(synth_corpus, tmp_path):
    """Rank 1 is killed (SIGKILL: no error of its own) before step 3, with a loader worker each: rank 0's
    all-reduce fails and its one ``error:`` line names rank 1 as ended; the checkpoint of step 2 is complete."""
    exp = tmp_path / "exp"
    proc = _torchrun(
        tmp_path, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.max_steps=6",
        "trainer.save_every=2", "trainer.eval_every=0", "data.num_workers=1",
        env=_env(HARNESS_KILL_RANK1_AT_STEP="3"),
    )  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-6000:]
    assert re.match(r"error: rank 0 of 2: rank 1 \(process \d+\) of this run ended \(killed, or out of memory\) "
                    r"during step 3's forward and backward", errors[0]), errors[0]  # fmt: skip
    assert "DataLoader worker" not in proc.stderr
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2]
    ck.load_train_state(exp / "checkpoints" / "step-000002")


def _log_time(line: str) -> float:
    """The wall-clock time of a log line (``[2026-11-27 23:33:37,051][...]``)."""
    stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", line).group(1)
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.slow  # ~40 s
def test_every_rank_exits_promptly_after_its_last_step_with_loader_workers(synth_corpus, tmp_path):
    """Two processes with two loader workers each (persistent: they prefetch across epochs) and a final
    dev evaluation: each process's interpreter has run its last exit handler within 15 s of the ``done``
    line, and the shutdown names its parts."""
    exp, exits = tmp_path / "exp", tmp_path / "exits"
    exits.mkdir()
    proc = _torchrun(
        tmp_path, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.max_steps=4",
        "trainer.eval_every=3", "trainer.dev_max_batches=1", "data.num_workers=2",
        env=_env(HARNESS_EXIT_TIMES=str(exits)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    done = next(line for line in proc.stdout.splitlines() if "- done:" in line)
    shut = next(line for line in proc.stdout.splitlines() if "shut down in" in line)
    assert "the loader workers" in shut and "the process groups" in shut
    for rank in (0, 1):
        exited = float((exits / f"exit-rank{rank}.txt").read_text())
        assert exited - _log_time(done) < 15, f"rank {rank} exited {exited - _log_time(done):.1f} s after done"


@pytest.mark.slow  # ~90 s
def test_an_elastic_restart_resumes_from_the_last_checkpoint_by_itself(synth_corpus, tmp_path):
    """``torchrun --max-restarts 1`` with ``resume=true``: rank 1 is killed before step 5 of the first
    attempt; torchrun restarts both processes, which resume from step 4 and end at step 6 with the losses
    of a run that was never killed."""
    args = [f"data.manifest_dir={synth_corpus}", "trainer.max_steps=6", "trainer.save_every=2", "trainer.eval_every=0"]
    straight = _torchrun(tmp_path, *args, f"trainer.exp_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-4000:]
    exp = tmp_path / "elastic"
    proc = _torchrun(
        tmp_path, *args, f"trainer.exp_dir={exp}", "resume=true",
        launcher=["--standalone", "--max-restarts", "1"], env=_env(HARNESS_KILL_RANK1_AT_STEP="5"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "resumed from" in proc.stdout and "step-000004 at step 4" in proc.stdout
    assert _losses(exp) == pytest.approx(_losses(tmp_path / "straight"), rel=1e-6)


@pytest.mark.slow  # ~50 s
def test_two_agents_of_a_c10d_rendezvous_train_as_one_launch(synth_corpus, tmp_path):
    """Two torchrun agents of one process each (``--nnodes 2 --rdzv-backend c10d``), standing in for two
    nodes, give the losses of one two-process launch."""
    args = [f"data.manifest_dir={synth_corpus}", "trainer.max_steps=3", "trainer.eval_every=0"]
    single = _torchrun(tmp_path, *args, f"trainer.exp_dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-4000:]
    endpoint = f"127.0.0.1:{_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "usmkit-test", str(HARNESS),
           *FAST, *args, f"trainer.exp_dir={tmp_path / 'nodes'}"]  # fmt: skip
    agents = [
        subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    try:
        outputs = [agent.communicate(timeout=LIMIT_S) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)  # the agent and its worker
    assert all(agent.returncode == 0 for agent in agents), [err[-3000:] for _, err in outputs]
    assert _losses(tmp_path / "nodes") == pytest.approx(_losses(tmp_path / "single"), rel=1e-6)


@pytest.mark.slow  # ~60 s each
@pytest.mark.parametrize(
    "to, signum, workers",
    [("group", signal.SIGINT, 0), ("agent", signal.SIGTERM, 0), ("agent", signal.SIGTERM, 1)],
    ids=["ctrl_c_in_a_terminal", "sigterm_to_torchrun", "sigterm_to_torchrun_with_loader_workers"],
)
def test_a_signal_to_a_torchrun_launch_saves_the_step_on_every_rank_and_resume_goes_on(
    synth_corpus, tmp_path, to, signum, workers
):
    """Ctrl-C in a terminal reaches torchrun and both workers, and torchrun passes the signal on to them
    again; a scheduler's SIGTERM reaches torchrun, which passes it on to each worker's whole process group
    (its loader workers too). Either way both ranks stop after the same step, rank 0 saves it, the run says
    where, and ``resume=true`` trains on from there to the end."""
    exp = tmp_path / "exp"
    args = [f"data.num_workers={workers}", f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}",
            "trainer.max_steps=400", "trainer.save_every=0", "trainer.eval_every=0"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(HARNESS),
           *FAST, *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not ((exp / "metrics.jsonl").is_file() and len(_losses(exp)) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach step 3"
            time.sleep(0.2)
        if to == "group":
            os.killpg(proc.pid, signum)  # what a terminal does: torchrun and both workers
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    stopped = re.search(rf"training stopped by {signum.name} after step (\d+) of 400, checkpoint saved", err + out)
    assert stopped, (err + out)[-6000:]
    step = int(stopped.group(1))
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [step]
    ck.load_train_state(exp / "checkpoints" / f"step-{step:06d}")
    assert "Traceback" not in err.split("training stopped by")[0], err[-6000:]
    resumed = _torchrun(tmp_path, *args[:-3], "trainer.max_steps=" + str(step + 3), "trainer.eval_every=0",
                        "resume=true")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    assert max(_losses(exp)) == step + 3
