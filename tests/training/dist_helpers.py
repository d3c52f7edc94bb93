"""What the distributed tests run in spawned processes (``torch.multiprocessing.spawn``, gloo on CPU): the
processes of a run set up by ``usmkit.training.distributed.setup_distributed``, each writing what it saw
to ``<out>/rank<r>.json``."""

from __future__ import annotations

import errno
import json
import os
import random
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from usmkit.config import OptimConfig, TrainerConfig
from usmkit.data.batch import Batch
from usmkit.models.output import StepOutput
from usmkit.training import distributed


def _setup(rank: int, world: int, port: int, options: dict) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    distributed.setup_distributed(
        "cpu", dist_timeout_s=options.get("dist_timeout_s", 60.0), rank0_timeout_s=options.get("rank0_timeout_s", 60.0)
    )


def _outcome(fn) -> dict:
    """``fn()``'s result, or the error it raised (type, message, and how long it took to come)."""
    start = time.perf_counter()
    try:
        return {"result": fn(), "seconds": time.perf_counter() - start}
    except Exception as e:
        return {
            "error": type(e).__name__,
            "message": str(e),
            "seconds": time.perf_counter() - start,
            "traceback": traceback.format_exc()[-3000:],
        }


def rank0_first_worker(rank: int, world: int, port: int, out: str, scenario: str, options: dict) -> None:
    """``rank0_first`` of a preparation that writes a file on rank 0 and reads it on the others.

    ``slow``: rank 0 takes ``options["prepare_s"]`` (longer than ``dist_timeout_s``); ``rank0_fails``: rank 0
    raises; ``rank1_fails``: rank 1 raises after rank 0 finished.
    """
    _setup(rank, world, port, options)
    marker = Path(out) / "prepared.txt"

    def prepare() -> str:
        if rank == 0:
            time.sleep(options.get("prepare_s", 0.0))
            if scenario == "rank0_fails":
                raise ValueError("rank 0's preparation failed")
            marker.write_text(f"written at {time.time()}")
            return "prepared"
        if scenario == "rank1_fails":
            raise ValueError("rank 1's preparation failed")
        return marker.read_text()  # FileNotFoundError had rank 0 not finished first

    outcome = _outcome(lambda: distributed.rank0_first(rank, prepare, "the test's preparation"))
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(outcome))
    distributed.shutdown_distributed(finished="error" not in outcome)


class _Task(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Linear(8, 1))

    def forward(self, batch: Batch) -> StepOutput:
        y = self.net(batch.features).squeeze(-1)  # (B, T)
        return StepOutput(loss=(y - 1).pow(2).mean(), metrics={})


class _Loader:
    """Endless fixed batches; ``stall_at``: the batch of that step (1-based) takes ``stall_s`` to come."""

    def __init__(self, stall_at: int | None, stall_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.batches = [
            Batch(
                features=torch.randn(2, 5, 3, generator=g),
                feature_lens=torch.tensor([5, 4]),
                tokens=torch.zeros(2, 0, dtype=torch.long),
                token_lens=torch.zeros(2, dtype=torch.long),
            )
            for _ in range(4)
        ]
        self.stall_at, self.stall_s, self.served, self.epoch = stall_at, stall_s, 0, 0

    def __iter__(self):
        while True:
            self.served += 1
            if self.served == self.stall_at:
                time.sleep(self.stall_s)
            yield self.batches[self.served % len(self.batches)]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]


def stalled_step_worker(rank: int, world: int, port: int, out: str, scenario: str, options: dict) -> None:
    """The trainer (DDP) for 6 steps, a checkpoint every 2; rank 1's batch of step 3 takes ``stall_s``."""
    _setup(rank, world, port, options)
    from usmkit.training.trainer import Trainer

    cfg = TrainerConfig(
        exp_dir=str(Path(out) / "exp"), max_steps=6, log_every=1, eval_every=0, save_every=2, progress=False,
        device="cpu", dist_timeout_s=options["dist_timeout_s"],
    )  # fmt: skip
    loader = _Loader(stall_at=3 if rank == 1 else None, stall_s=options["stall_s"])
    trainer = Trainer(cfg, OptimConfig(lr=1e-2, warmup_steps=1), _Task(), loader, "x: 1\n")
    outcome = _outcome(lambda: trainer.fit().step)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(outcome))
    trainer = None  # DDP's reducer before the process group (usmkit.training.recipe.TrainingRecipe.cleanup)
    distributed.shutdown_distributed(finished="error" not in outcome)


def background_checkpoint_worker(rank: int, world: int, port: int, out: str, scenario: str, options: dict) -> None:
    """The trainer (DDP) for 6 steps, a checkpoint every 2, written by rank 0 in the background
    (``async_save``), or in the loop (scenario ``in_the_loop``). ``full_disk``: rank 0's disk is full at the
    checkpoint of step 4."""
    _setup(rank, world, port, options)
    random.seed(rank)
    np.random.seed(rank)  # the train state holds each rank's Python and NumPy random states too
    from usmkit.checkpointing import checkpoint as ck
    from usmkit.training.trainer import Trainer

    if scenario == "full_disk" and rank == 0:
        real = ck.save_file

        def full(tensors, path, *args, **kwargs):
            if "step-000004" in str(path):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(tensors, path, *args, **kwargs)

        ck.save_file = full
    cfg = TrainerConfig(
        exp_dir=str(Path(out) / "exp"), max_steps=6, log_every=1, eval_every=0, save_every=2, progress=False,
        device="cpu", async_save=scenario != "in_the_loop",
    )  # fmt: skip
    trainer = Trainer(cfg, OptimConfig(lr=1e-2, warmup_steps=1), _Task(), _Loader(None, 0.0), "x: 1\n")
    outcome = _outcome(lambda: trainer.fit().step)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(outcome))
    trainer = None
    distributed.shutdown_distributed(finished="error" not in outcome)
