"""What the FSDP tests run, in the test process (one process, the reference) and in spawned workers
(``torch.multiprocessing.spawn``, gloo on CPU): the real trainer on a tiny joint CTC/LAS model with
intermediate CTC, over fixed batches of which each process takes its slice of the rows."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from usmkit.checkpointing.checkpoint import CheckpointWriteError
from usmkit.config import OptimConfig, TaskConfig, TrainerConfig
from usmkit.data.batch import Batch
from usmkit.models.las import LASConfig
from usmkit.models.presets import tiny
from usmkit.tasks import build_task
from usmkit.training.task_spec import train_spec
from usmkit.training.trainer import Trainer

VOCAB = 24
ROWS = 4  # the global batch; each of W processes takes ROWS / W rows
OPTIM = OptimConfig(lr=2e-3, warmup_steps=1, grad_clip=1.0)  # clipping is on from the first step


def global_batches(n: int = 4) -> list[Batch]:
    """``n`` fixed batches of ROWS utterances: (ROWS, 96, 80) features of several lengths, tokens padded with -1."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n):
        lens = torch.tensor([96, 80, 71, 88])
        feats = torch.randn(ROWS, 96, 80, generator=g) * (torch.arange(96)[None, :, None] < lens[:, None, None])
        token_lens = torch.tensor([5, 3, 4, 2])
        tokens = torch.randint(4, VOCAB, (ROWS, 5), generator=g)
        tokens = tokens.masked_fill(torch.arange(5)[None, :] >= token_lens[:, None], -1)
        batches.append(Batch(features=feats, feature_lens=lens, tokens=tokens, token_lens=token_lens))
    return batches


def rows(batch: Batch, rank: int, world: int) -> Batch:
    """This process's rows of a global batch."""
    n = ROWS // world
    part = slice(rank * n, (rank + 1) * n)
    return replace(
        batch,
        features=batch.features[part],
        feature_lens=batch.feature_lens[part],
        tokens=batch.tokens[part],
        token_lens=batch.token_lens[part],
    )


class ListLoader:
    """Batches in a fixed order; its state is the position (``set_epoch`` starts over)."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches, self.pos, self.epoch = batches, 0, 0

    def __iter__(self):
        while self.pos < len(self.batches):
            self.pos += 1
            yield self.batches[self.pos - 1]
        self.pos = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.pos = epoch, 0

    def state_dict(self) -> dict:
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, sd: dict) -> None:
        self.pos, self.epoch = sd["pos"], sd["epoch"]


def build_module() -> torch.nn.Module:
    """Joint CTC/LAS with intermediate CTC (its CTC head runs twice per step), no dropout: deterministic."""
    torch.manual_seed(0)
    encoder_cfg = tiny(num_layers=2, dropout=0.0, chunk_size=8, zero_init_residual=False)
    task = TaskConfig(kind="las", ctc_weight=0.5, inter_ctc_weight=0.3, las=LASConfig(num_layers=1, dropout=0.0))
    return build_task(task, encoder_cfg, VOCAB)


def train(
    exp: Path, loader, max_steps: int, resume: bool = False, probe: Batch | None = None, **trainer_options
) -> list[tuple[int, float]]:
    """The trainer on ``loader`` for ``max_steps`` (a checkpoint every 2 steps and at the end); its losses.

    ``probe``: then one more forward and backward on it, without a step, and the full gradients by
    parameter name (gathered from the shards) are written to ``exp/grads.safetensors`` (rank 0).
    """
    module = build_module()
    cfg = TrainerConfig(
        exp_dir=str(exp), max_steps=max_steps, log_every=1, eval_every=0, save_every=2, progress=False,
        device="cpu", **trainer_options,
    )  # fmt: skip
    trainer = Trainer(cfg, OPTIM, module, loader, "x: 1\n", spec=train_spec(module, OPTIM))
    if resume:
        assert trainer.resume()
    losses = trainer.fit().losses
    if probe is not None:
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer._forward_backward(probe, sync=True)
        grads = {
            name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
            for name, p in trainer.module.named_parameters()
        }
        if not dist.is_initialized() or dist.get_rank() == 0:
            save_file(grads, str(exp / "grads.safetensors"))
    return losses


def worker(rank: int, world: int, port: int, out: str, scenario: str, options: dict) -> None:
    """One spawned process: train this rank's rows under ``trainer.strategy=fsdp``; rank 0 writes
    ``<out>/result.json`` with the losses averaged over the processes (the global batch's loss)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if options.pop("aot_eager", False):  # compile without inductor's C++ build: minutes on this CPU
            real = torch.compile
            torch.compile = lambda f, **kw: real(f, **{**kw, "backend": "aot_eager"})
        if options.pop("fail_write_on_rank", None) == rank:  # its disk fills up after its first optimizer shard
            import errno

            import safetensors.torch

            real_save, calls = safetensors.torch.save, []

            def full(*args, **kwargs):
                calls.append(1)
                if len(calls) > 1:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_save(*args, **kwargs)

            safetensors.torch.save = full  # what DCP's safetensors writer calls, once per checkpoint
        batches = global_batches()
        if scenario == "resume":  # from the step-2 checkpoint of another run, on the global batches from step 3
            loader, steps, resume = ListLoader([rows(b, rank, world) for b in batches[2:3]]), 3, True
        else:
            loader, steps, resume = ListLoader([rows(b, rank, world) for b in batches[:3]]), 3, False
        probe = rows(batches[3], rank, world)
        try:
            losses = train(Path(out) / "exp", loader, steps, resume=resume, probe=probe, strategy="fsdp", **options)
        except CheckpointWriteError as e:
            (Path(out) / f"error{rank}.txt").write_text(str(e))
            return
        mean = torch.tensor([loss for _, loss in losses]) / world
        dist.all_reduce(mean)  # rows split evenly: the mean of the processes' means is the global mean
        if rank == 0:
            (Path(out) / "result.json").write_text(
                json.dumps({"steps": [s for s, _ in losses], "losses": mean.tolist()})
            )
    finally:
        dist.destroy_process_group()
