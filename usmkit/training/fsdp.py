"""Fully sharded data parallelism (``trainer.strategy=fsdp``) with PyTorch's FSDP2 (``fully_shard``).

Every process keeps 1 / world of each parameter, of its gradient and of its optimizer state. The
task names the units to shard one by one (``TrainSpec.shard_units``: each Conformer block and head);
a unit gathers its full weights just before its forward runs and frees them after it (again for its
backward), so at most a unit or two is whole at a time. The rest of the model (the front end, small
glue) is the root unit, gathered for the whole step. Gradients are reduce-scattered to their shards.

Precision: on CUDA with bf16 (``trainer.precision=auto|bf16``) the gathered weights are bf16 and the
gradients are reduced in fp32 into fp32 shards (``MixedPrecisionPolicy``); the step's autocast stays
on, so losses, norms and the residual stream keep fp32 as in the unsharded step (hence
``cast_forward_inputs=False``). On a CPU (gloo) everything stays fp32.

Order with the other wrappers, as torchtitan applies them: activation checkpointing
(``usmkit.training.activation_checkpoint``), then ``torch.compile`` of each block (``usmkit.training.compile_blocks``),
then ``fully_shard``; its hooks run eagerly around each compiled block forward. (Sharding before
compiling gives the same losses in torch 2.11; ``tests/test_fsdp.py`` runs the order used here.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def mixed_precision(device: torch.device, precision: str) -> MixedPrecisionPolicy:
    """bf16 gathered weights and fp32 gradient reduction on CUDA with bf16; fp32 everywhere else."""
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return MixedPrecisionPolicy(cast_forward_inputs=False)


def shard_model(module: nn.Module, units: Sequence[nn.Module], device: torch.device, precision: str) -> int:
    """``fully_shard`` each of ``units`` (modules inside ``module``), then ``module`` itself (the root, which
    takes the remaining parameters), over all processes of the default group; returns how many units.

    The parameters become ``DTensor`` shards (new ``nn.Parameter`` objects under the same names):
    build the optimizer afterwards. Needs ``torch.distributed`` initialized.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "trainer.strategy=fsdp needs torch.distributed: launch with torchrun (torchrun --nproc-per-node N "
            "-m usmkit.cli.train ..., N=1 for one GPU)"
        )
    inside = {id(m) for m in module.modules()}
    outside = [type(u).__name__ for u in units if id(u) not in inside or u is module]
    if outside:
        raise ValueError(f"shard units must be submodules of the model: {outside} are not")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision(device, precision)
    for unit in units:  # bottom-up: each unit takes its own parameters before the root takes the rest
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    return len(units)


def is_sharded(module: nn.Module) -> bool:
    return isinstance(module, FSDPModule)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for sharded (``DTensor``) gradients: the global norm over every
    process's shards (a plain tensor, the same on each), and the gradients scaled by
    ``min(1, max_norm / norm)``. ``max_norm=inf`` only measures."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()  # the partial norms of the shards, reduced over the processes
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """Every unit of the sharded ``module`` whole on every process, and kept whole through forwards.

    All processes enter; inside, one process may run the model alone (rank 0's dev evaluation, any
    method of any submodule), since no unit needs to gather anything. On exit the shards are restored
    (the root keeps its weights after forward, as FSDP's default; the other units free theirs again).
    """
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not module, recurse=False)
