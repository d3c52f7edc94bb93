"""The trainer's interface to what it trains: the loader it reads, the model's parameter groups and
units (``TrainSpec``, built by ``usmkit.training.task_spec``), and what a run returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from usmkit.data.batch import Batch


class ResumableLoader(Protocol):
    def __iter__(self) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, sd: dict[str, Any]) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...


DevEval = Callable[[torch.nn.Module], dict[str, float]]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters that share a learning-rate rule: the schedule times ``lr_scale``, and 0 (no update,
    no weight decay) during the first ``frozen_steps`` steps."""

    name: str
    params: tuple[torch.nn.Parameter, ...]
    lr_scale: float = 1.0
    frozen_steps: int = 0


@dataclass(frozen=True)
class TrainSpec:
    """What the trainer needs to know of the model it trains, supplied by the task (``usmkit.tasks.train_spec``).

    ``param_groups``: the optimizer's groups, covering every trainable parameter once (the first
    group's rate is the one the progress bar shows); empty: one group of all of them.
    ``compile_units``: the modules ``trainer.compile_scope=blocks`` compiles one by one (their
    forwards take tensors batch-first). ``dynamic_axes``: a batch's (tensor, dim) pairs that vary from
    batch to batch, marked dynamic for ``trainer.compile_scope=whole``; None: every axis static.
    ``checkpoint_units``: the modules whose activations ``trainer.activation_checkpointing`` recomputes
    in the backward. ``shard_units``: the modules ``trainer.strategy=fsdp`` shards one by one (each
    gathers its weights when its ``forward`` runs; the rest of the model is gathered for the whole step).
    """

    param_groups: tuple[ParamGroup, ...] = ()
    compile_units: tuple[torch.nn.Module, ...] = ()
    dynamic_axes: Callable[[Batch], Sequence[tuple[torch.Tensor, int]]] | None = None
    checkpoint_units: tuple[torch.nn.Module, ...] = ()
    shard_units: tuple[torch.nn.Module, ...] = ()


@dataclass
class TrainResult:
    step: int
    last_loss: float
    best: dict | None
    bad_steps: int
    losses: list[tuple[int, float]]  # (step, loss) at every optimizer step, for tests and plots
