"""What the trainer must know of a task's module (``TrainSpec``): its parameter groups, the units to
compile, checkpoint and shard, and the batch axes that vary. The trainer itself knows no model internals;
this module knows them for it.
"""

from __future__ import annotations

import torch

from usmkit.config import OptimConfig
from usmkit.data.batch import Batch
from usmkit.models.conformer import ConformerBlock
from usmkit.models.subsampling import Conv2dSubsampling
from usmkit.training.spec import ParamGroup, TrainSpec

COMPILE_UNITS = (ConformerBlock, Conv2dSubsampling)  # what trainer.compile_scope=blocks compiles one by one


def train_spec(module: torch.nn.Module, optim: OptimConfig) -> TrainSpec:
    """What the trainer needs to know of ``module``: its parameter groups, the units to compile, checkpoint
    and shard, and the dynamic batch axes."""
    units = compile_units(module)
    return TrainSpec(
        param_groups=encoder_param_groups(module, optim),
        compile_units=units,
        dynamic_axes=batch_dynamic_axes,
        checkpoint_units=units,
        shard_units=shard_units(module),
    )


def compile_units(module: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """Every Conformer block and subsampling front end in ``module``: one compiled graph serves each kind."""
    return tuple(m for m in module.modules() if isinstance(m, COMPILE_UNITS))


def shard_units(module: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """What ``trainer.strategy=fsdp`` shards one by one: every Conformer block, and every head, i.e. each
    child of the task module that holds parameters and no Conformer block (CTC, LAS decoder, BEST-RQ's
    softmax heads). The front end and what else remains go with the root."""
    blocks = tuple(m for m in module.modules() if isinstance(m, ConformerBlock))
    heads = tuple(
        child
        for child in module.children()
        if any(True for _ in child.parameters()) and not any(isinstance(m, ConformerBlock) for m in child.modules())
    )
    return blocks + heads


def encoder_param_groups(module: torch.nn.Module, optim: OptimConfig) -> tuple[ParamGroup, ...]:
    """With ``optim.encoder_lr_scale`` / ``optim.freeze_encoder_steps``: the head's parameters, then the
    encoder's (named ``encoder.*``) at their own rate; otherwise none (the trainer's single group)."""
    if not optim.splits_encoder:
        return ()
    encoder, head = [], []
    for name, p in module.named_parameters():
        if p.requires_grad:
            (encoder if name.startswith("encoder.") else head).append(p)
    if not encoder:
        raise ValueError(
            "optim.encoder_lr_scale / optim.freeze_encoder_steps are set but the model has no parameters "
            "named encoder.*; leave them at 1.0 / 0 for this task"
        )
    return (
        ParamGroup("head", tuple(head)),
        ParamGroup("encoder", tuple(encoder), optim.encoder_lr_scale, optim.freeze_encoder_steps),
    )


def batch_dynamic_axes(batch: Batch) -> list[tuple[torch.Tensor, int]]:
    """The axes the bucketing sampler varies: every tensor's batch axis and the token axis. The feature
    time axis comes in a few padded lengths (``data.pad_to_frames``) and stays static. A packed batch
    (``data.pack_to_frames``): its rows are always the same, only the utterance and token axes vary. A MOST
    step (``MostBatch``): those of its audio batches."""
    if not isinstance(batch, Batch):
        return [
            axis for part in (batch.unlabeled, batch.paired) if part is not None for axis in batch_dynamic_axes(part)
        ]
    utterances = [(batch.feature_lens, 0), (batch.tokens, 0), (batch.token_lens, 0), (batch.tokens, 1)]
    if batch.packing is not None:
        return [*utterances, (batch.packing.rows, 0), (batch.packing.offsets, 0)]
    return [(batch.features, 0), *utterances]
