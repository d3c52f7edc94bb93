"""The processes of one batch transcription under ``torchrun``: which one this is, and the few exchanges.

``torchrun --nproc-per-node N -m usmkit.cli.transcribe_batch ...`` starts N processes with ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` set; without it there is one. The processes share no tensors: they
join one gloo group (CPU, whatever the device) for two exchanges only, both of Python objects:

1. rank 0 finds the inputs and what is already done, and sends that to every rank (``share``), so
   all ranks split the same list, and none writes before rank 0 has read the old output;
2. at the end each rank's summary goes to rank 0 (``gather``), which then merges the outputs.

Exchange 2 waits for the slowest rank, so its timeout (``timeout_s``) is long: hours of audio per
rank. A rank that fails makes ``torchrun`` stop the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from usmkit.device import resolve_device
from usmkit.errors import UsageError


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    _owns_group: bool = False

    @classmethod
    def from_env(cls, timeout_s: float) -> Ranks:
        """This process's rank from ``torchrun``'s environment (one process without it); with several,
        the gloo group is joined here."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ranks = cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
            ranks._owns_group = True
        return ranks

    def device(self, name: str) -> torch.device:
        """``resolve_device(name)``; with several processes on GPUs, this process's own (``LOCAL_RANK``)."""
        device = resolve_device(name)
        if device.type == "cuda" and device.index is None:  # set_device needs an index
            device = torch.device("cuda", self.local_rank if self.world > 1 else torch.cuda.current_device())
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    def share(self, make) -> Any:
        """``make()`` on rank 0, its result on every rank; a ``UsageError`` it raises is raised on every rank."""
        if self.world == 1:
            return make()
        box: list[Any] = [None]
        error = None
        if self.rank == 0:
            try:
                box[0] = ("ok", make())
            except UsageError as e:
                error, box[0] = e, ("error", str(e))
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise error or UsageError(value)  # the message travels, not the exception (its class may not pickle)
        return value

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on rank 0 (by rank); ``[obj]`` elsewhere."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out if self.rank == 0 else [obj]

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
