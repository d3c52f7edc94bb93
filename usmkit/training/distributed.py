"""Processes of one training run: the process group torchrun asks for, and rank-0-first preparation.

Every rank takes the same collectives in the same order: a helper here never decides on one rank
alone whether to wait for the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from usmkit.device import resolve_device

T = TypeVar("T")


def launched_distributed(strategy: str) -> bool:
    """Whether ``setup_distributed`` inits torch.distributed: torchrun started several processes, or one
    with ``trainer.strategy=fsdp`` (FSDP needs a process group even for one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > 1 or (strategy == "fsdp" and "MASTER_ADDR" in os.environ)


def setup_distributed(device_name: str, strategy: str = "ddp") -> tuple[int, int, torch.device]:
    """Init torch.distributed when launched by torchrun (``launched_distributed``); returns (rank,
    world_size, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(device_name)
    if launched_distributed(strategy) and not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, world, device


def rank0_first(rank: int, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 first, then on the other ranks, which reuse what it cached on disk
    (a tokenizer, stored features, statistics). One barrier per rank either way."""
    if rank != 0 and dist.is_initialized():
        dist.barrier()
    out = fn()
    if rank == 0 and dist.is_initialized():
        dist.barrier()
    return out
