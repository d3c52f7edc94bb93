"""Two GPUs (NCCL), start to exit through torchrun: DDP and FSDP2, compiled with padded lengths, on a fresh
corpus copy (rank 0 trains the tokenizer and stores the features; rank 1 arrives late), with loader workers,
checkpoints and a final dev evaluation. Each process exits within 15 s of the ``done`` line. A rank that
stalls ends the run through NCCL's watchdog within ``trainer.dist_timeout_s``."""

from __future__ import annotations

import re
import time

import pytest
import torch
from test_distributed import _env, _fresh_copy, _log_time, _losses, _torchrun

from usmkit.checkpointing import checkpoint as ck

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

GPU = ["trainer.device=cuda", "trainer.precision=bf16", "data.num_workers=2"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gpus_compiled_start_to_exit(synth_corpus, tmp_path, strategy):
    corpus, exp, exits = _fresh_copy(synth_corpus, tmp_path), tmp_path / "exp", tmp_path / "exits"
    exits.mkdir()
    start = time.monotonic()
    proc = _torchrun(
        tmp_path, *GPU, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", f"trainer.strategy={strategy}",
        "vocab_size=300", "data.features.precomputed=true", "data.speed_perturb=[]", "trainer.compile=true",
        "data.pad_to_frames=256", "trainer.max_steps=20", "trainer.save_every=10", "trainer.eval_every=20",
        "trainer.dev_max_batches=2",
        env=_env(HARNESS_DELAY_RANK1_S="3", HARNESS_EXIT_TIMES=str(exits)),
    )  # fmt: skip
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert sorted(_losses(exp))[-1] == 20 and [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [10, 20]
    done = next(line for line in proc.stdout.splitlines() if "- done:" in line)
    print(
        f"{strategy}: {wall:.0f} s from launch to exit; {next(ln for ln in proc.stdout.splitlines() if 'shut down in' in ln)}"
    )
    for rank in (0, 1):
        after = float((exits / f"exit-rank{rank}.txt").read_text()) - _log_time(done)
        assert after < 15, f"rank {rank} exited {after:.1f} s after done"


def test_two_gpus_a_stalled_rank_ends_the_run(synth_corpus, tmp_path):
    """Rank 1 sleeps before step 3: rank 0's collectives of step 3 never complete; with
    trainer.dist_timeout_s=30 the run ends (NCCL's watchdog or usmkit's error, naming the rank) long before
    the sleep would, and the checkpoint of step 2 is complete."""
    exp = tmp_path / "exp"
    start = time.monotonic()
    proc = _torchrun(
        tmp_path, *GPU, f"data.manifest_dir={synth_corpus}", f"trainer.exp_dir={exp}", "trainer.max_steps=6",
        "trainer.save_every=2", "trainer.eval_every=0", "trainer.dist_timeout_s=30",
        env=_env(HARNESS_STALL_RANK1_AT_STEP="3"),
    )  # fmt: skip
    assert proc.returncode != 0 and time.monotonic() - start < 400, proc.stderr[-4000:]
    assert re.search(
        r"\[Rank 0\].*(Watchdog caught collective operation timeout|timed out)|error: rank 0 of 2", proc.stderr
    )
    assert [c.step for c in ck.list_checkpoints(exp / "checkpoints")] == [2]
