"""trainer.strategy=fsdp on the CPU (gloo): two processes give one process's losses and weights on the
same global batch (eager, and with activation checkpointing + per-block compile), a sharded checkpoint
of two processes resumes on one, and bad combinations are refused before any data is read."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import fsdp_helpers
import pytest
import torch
import torch.multiprocessing as mp
from composed_config import train_config
from safetensors.torch import load_file

from usmkit.checkpointing import checkpoint as ck
from usmkit.checkpointing.sharded import OPTIMIZER_DIR

pytestmark = pytest.mark.usefixtures("one_thread")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out: Path, world: int, scenario: str = "train", **options) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(fsdp_helpers.worker, args=(world, _port(), str(out), scenario, options), nprocs=world)
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], Path]:
    """One process, no sharding, the whole global batch per step: losses of steps 1..3 and its exp dir."""
    exp = tmp_path_factory.mktemp("reference") / "exp"
    batches = fsdp_helpers.global_batches()
    losses = fsdp_helpers.train(exp, fsdp_helpers.ListLoader(batches[:3]), 3, probe=batches[3])
    return [loss for _, loss in losses], exp


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("fsdp2")
    return _spawn(out, 2), out / "exp"


def _weights(exp: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(exp / "checkpoints" / f"step-{step:06d}" / ck.MODEL_FILE))


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to rounding. Adam turns the rounding noise of gradients that are zero in exact arithmetic
    (attention key biases: softmax ignores a constant added to every logit), and the front end's
    (``_assert_same_grads``), into steps of up to the learning rate: a few steps at lr 2e-3 move such a
    weight by ~1e-3. So each tensor's error norm is held to 1e-3 of its norm, and most to rounding."""
    assert got.keys() == want.keys()
    errors = {k: ((got[k] - want[k]).norm() / want[k].norm().clamp_min(1e-12)).item() for k in want}
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-3, f"{worst}: relative error {errors[worst]:.2e}"
    assert sorted(errors.values())[len(errors) // 2] < 1e-5, "most weights should agree to fp32 rounding"


def _assert_same_grads(exp: Path, ref_exp: Path) -> None:
    """The full gradients of one more batch after the 3 steps (the probe), gathered from the shards.

    Compared by each tensor's relative error norm: splitting the batch over processes changes the fp32
    summation order, and the front end's gradients (a sum over every frame of the deepest backward) then
    differ by up to ~0.5% on some CPUs; a sharding or averaging mistake is off by tens of percent."""
    got, want = (load_file(str(e / "grads.safetensors")) for e in (exp, ref_exp))
    assert got.keys() == want.keys()
    errors = {k: ((got[k] - want[k]).norm() / want[k].norm().clamp_min(1e-12)).item() for k in want}
    worst = max(errors, key=errors.get)
    assert errors[worst] < 2e-2, f"{worst}: relative error {errors[worst]:.2e}"
    assert sorted(errors.values())[len(errors) // 2] < 1e-4, "most gradients should agree to fp32 rounding"


def _grad_norms(exp: Path) -> list[float]:
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    return [row["train/grad_norm"] for row in rows if "train/grad_norm" in row]


def test_two_processes_match_one_process(reference, two_processes):
    ref_losses, ref_exp = reference
    result, exp = two_processes
    assert result["steps"] == [1, 2, 3]
    torch.testing.assert_close(result["losses"], ref_losses, rtol=1e-5, atol=1e-5)
    # The global gradient norm before clipping (clipping took part) and the gradients themselves.
    assert min(_grad_norms(ref_exp)) > fsdp_helpers.OPTIM.grad_clip
    torch.testing.assert_close(_grad_norms(exp), _grad_norms(ref_exp), rtol=1e-5, atol=0)
    _assert_same_grads(exp, ref_exp)
    # The exported weights (gathered to rank 0) after 3 steps are the reference's.
    _assert_same_weights(_weights(exp, 3), _weights(ref_exp, 3))
    # A sharded checkpoint: the usual files, the optimizer state in DCP's safetensors shards, one per process.
    ckpt = exp / "checkpoints" / "step-000003"
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 3]
    assert sorted(p.suffix for p in (ckpt / OPTIMIZER_DIR).iterdir()) == [".safetensors", ".safetensors"]
    state = ck.load_train_state(ckpt)  # SHA-256 checked
    assert state["strategy"] == "fsdp" and state["world_size"] == 2 and "state" not in state["optimizer"]
    assert not list((exp / "checkpoints").glob(".tmp-*"))
    # The export loads into an unsharded model, as evaluation and init_from load it.
    module = fsdp_helpers.build_module()
    ck.load_weights(module, ckpt)


@pytest.mark.parametrize(
    "scope", [None, pytest.param("blocks", marks=pytest.mark.slow), pytest.param("whole", marks=pytest.mark.slow)]
)  # compiled: 15-40 s each on 2 cores
def test_activation_checkpointing_and_compiled_blocks_under_fsdp(reference, tmp_path, scope):
    """compiled blocks then checkpointed (or checkpointed blocks in a compiled step), then sharded: the
    order the trainer applies."""
    ref_losses, ref_exp = reference
    options = dict(compile=True, compile_scope=scope, aot_eager=True) if scope else {}
    result = _spawn(tmp_path, 2, activation_checkpointing=True, **options)
    torch.testing.assert_close(result["losses"], ref_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_grad_norms(tmp_path / "exp"), _grad_norms(ref_exp), rtol=1e-5, atol=0)
    _assert_same_grads(tmp_path / "exp", ref_exp)
    _assert_same_weights(_weights(tmp_path / "exp", 3), _weights(ref_exp, 3))


def test_sharded_checkpoint_of_two_processes_resumes_on_one(two_processes, tmp_path):
    result, exp = two_processes
    run = tmp_path / "exp"
    shutil.copytree(exp, run)
    shutil.rmtree(run / "checkpoints" / "step-000003")  # resume from step 2, written by two processes
    resumed = _spawn(tmp_path, 1, "resume")
    assert resumed["steps"] == [3]
    torch.testing.assert_close(resumed["losses"], result["losses"][2:], rtol=1e-5, atol=1e-5)
    _assert_same_weights(_weights(run, 3), _weights(exp, 3))


def test_damaged_optimizer_shard_falls_back_to_the_checkpoint_before(two_processes, tmp_path):
    _, exp = two_processes
    run = tmp_path / "exp"
    shutil.copytree(exp, run)
    shard = sorted((run / "checkpoints" / "step-000003" / OPTIMIZER_DIR).iterdir())[-1]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = _spawn(tmp_path, 1, "resume")
    assert resumed["steps"] == [3]  # from step 2: the damaged step-3 checkpoint was passed over


def test_a_failed_shard_write_stops_every_process_and_keeps_the_last_checkpoint(tmp_path):
    """Rank 1's disk is full at the second checkpoint (step 3): both processes stop with CheckpointWriteError."""
    tmp_path.mkdir(exist_ok=True)
    mp.spawn(fsdp_helpers.worker, args=(2, _port(), str(tmp_path), "train", {"fail_write_on_rank": 1}), nprocs=2)
    for rank in (0, 1):
        message = (tmp_path / f"error{rank}.txt").read_text()
        assert "could not write checkpoint" in message and "step-000003" in message
    assert "No space left on device" in (tmp_path / "error1.txt").read_text()
    checkpoints = tmp_path / "exp" / "checkpoints"
    assert [c.step for c in ck.list_checkpoints(checkpoints)] == [2] and not list(checkpoints.glob(".tmp-*"))
    ck.load_train_state(checkpoints / "step-000002")  # intact (SHA-256 checked)


def test_ddp_checkpoint_is_not_resumed_as_fsdp(reference, tmp_path):
    _, ref_exp = reference
    run = tmp_path / "exp"
    shutil.copytree(ref_exp, run)
    with pytest.raises(Exception, match=r"written with trainer.strategy=ddp.*init_from="):
        _spawn(tmp_path, 1, "resume")


# ---- the command line: torchrun, evaluation of the export, refusals


REPO = Path(__file__).resolve().parents[2]
FAST = [
    "recipe=stage3_ctc",
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=20",
    "data.num_workers=0",
    "trainer.log_every=1",
    "trainer.progress=false",
    "trainer.device=cpu",
    "optim.warmup_steps=2",
]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def _torchrun(nproc: int, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd += ["-m", "usmkit.cli.train", *FAST, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc


def test_torchrun_fsdp_evaluates_saves_and_the_export_evaluates(synth_corpus, tmp_path):
    """Two processes: dev evaluation on rank 0 (the sharded model gathered for it), the best checkpoint
    written by both; ``usmkit.cli.evaluate`` reads its ``model.safetensors`` as any checkpoint's."""
    exp = tmp_path / "exp"
    run = [f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.strategy=fsdp"]
    _torchrun(2, tmp_path, *run, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.save_every=2",
              "trainer.dev_max_batches=2")  # fmt: skip
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2] and [
        r["step"] for r in rows if "dev/dev_wer" in r
    ] == [2]
    assert [r["step"] for r in rows if "train/checkpoint_s" in r] == [2]  # the best checkpoint, written once
    assert 0 <= rows[0]["train/loader_wait"] < 1
    assert ck.read_best(exp / "checkpoints")["path"] == "step-000002"
    assert (exp / "checkpoints" / "step-000002" / OPTIMIZER_DIR).is_dir()
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "usmkit.cli.evaluate", f"checkpoint={exp}", "test_sets=[test]", f"output={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["sets"]["test"]["utterances"] > 0


@pytest.mark.slow  # ~10-15 s; the CTC/LAS runs above cover the mechanism in the default suite
def test_torchrun_fsdp_bestrq_at_eight_x(synth_corpus, tmp_path):
    """BEST-RQ (its softmax heads a unit of their own, masked frames gathered by data-dependent indexing)
    at 8x subsampling: two sharded steps, rank 0's dev loss on the gathered model, a sharded checkpoint."""
    exp = tmp_path / "exp"
    _torchrun(2, tmp_path, "recipe=stage1", f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}",
              "trainer.strategy=fsdp", "model.subsampling_factor=8", "task.bestrq.num_codebooks=2",
              "task.bestrq.codebook_size=64", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.save_every=2",
              "trainer.dev_max_batches=2")  # fmt: skip
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    assert all(r["train/loss"] > 0 for r in rows if "train/loss" in r)
    assert [r["dev/dev_loss"] > 0 for r in rows if "dev/dev_loss" in r] == [True]
    weights = _weights(exp, 2)
    assert weights["heads.weight"].shape == (2 * 64, 64) and "encoder.subsampling.conv.4.weight" in weights


@pytest.mark.slow
def test_torchrun_fsdp_resumes_on_another_number_of_processes(synth_corpus, tmp_path):
    """The real bucketing sampler cannot continue its position at another world size: the epoch starts
    over, with a warning; weights and optimizer state carry over."""
    exp = tmp_path / "exp"
    run = [
        f"data.manifest_dir={synth_corpus}",
        f"trainer.exp_dir={exp}",
        "trainer.strategy=fsdp",
        "trainer.eval_every=0",
    ]
    _torchrun(2, tmp_path, *run, "trainer.max_steps=2", "trainer.save_every=2")
    proc = _torchrun(1, tmp_path, *run, "trainer.max_steps=3", "trainer.save_every=3", "resume=true")
    assert "was written by 2 processes, this run has 1" in proc.stdout + proc.stderr
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2, 3]
    assert ck.load_train_state(exp / "checkpoints" / "step-000003")["world_size"] == 1


def _config(*overrides: str):
    return train_config(*FAST, *overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.strategy=fsdp"], r"trainer.strategy=fsdp needs torch.distributed: launch with torchrun"),
        (
            ["trainer.compile=true", "data.pad_to_frames=256", "trainer.compile_mode=reduce-overhead", "trainer.strategy=fsdp"],
            r"reduce-overhead \(CUDA graphs\) needs a CUDA device.*does not work with trainer.strategy=fsdp",
        ),
        (["trainer.device=cuda"], "trainer.device=cuda but this machine has no CUDA device"),
        (["recipe=stage1", "model.subsampling_factor=8", "task.bestrq.stack_frames=4"],
         "task.bestrq.stack_frames=4 does not match model.subsampling_factor=8"),
        (["model.subsampling_factor=6"], r"subsampling_factor must be one of \(4, 8\)"),
    ],
)  # fmt: skip
def test_bad_combinations_are_refused_before_any_data_is_read(tmp_path, monkeypatch, overrides, message):
    from usmkit.config import ConfigError
    from usmkit.training.recipe import run

    if "trainer.device=cuda" in overrides and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    for name in ("MASTER_ADDR", "WORLD_SIZE"):  # as a plain `python -m usmkit.cli.train` sees it
        monkeypatch.delenv(name, raising=False)
    cfg, yaml_text = _config(
        f"data.manifest_dir={tmp_path / 'no-corpus'}", f"trainer.exp_dir={tmp_path}/exp", *overrides
    )
    with pytest.raises(ConfigError, match=message):  # and not "no cuts manifest": no data was looked at
        run(cfg, yaml_text)


def test_a_precision_that_does_not_exist_is_refused_by_name(tmp_path):
    from usmkit.config import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.precision: 'fp16' is not one of \('auto', 'bf16', 'fp32'\)"):
        _config("trainer.precision=fp16", f"trainer.exp_dir={tmp_path}")
