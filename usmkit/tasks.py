"""Builds the module a recipe trains (``Batch -> StepOutput``) and what the trainer must know of it.

This is where configuration meets model classes: one explicit branch per task kind in ``build_task``;
``train_spec`` tells the trainer, which knows no model internals, the parameter groups, the blocks to
compile, checkpoint and shard, and the batch axes that vary.
"""

from __future__ import annotations

import torch

from usmkit.config import OptimConfig, TaskConfig
from usmkit.data.batch import Batch
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerBlock, ConformerEncoder
from usmkit.models.subsampling import Conv2dSubsampling
from usmkit.trainer import ParamGroup, TrainSpec

COMPILE_UNITS = (ConformerBlock, Conv2dSubsampling)  # what trainer.compile_scope=blocks compiles one by one


def build_task(task: TaskConfig, encoder_cfg: ConformerConfig, vocab_size: int) -> torch.nn.Module:
    encoder = ConformerEncoder(encoder_cfg)
    if task.kind in ("ctc", "las"):
        from usmkit.models.asr import AsrHeadConfig, AsrModel

        las = task.las if task.kind == "las" else None
        ctc_weight = task.ctc_weight if task.kind == "las" else 1.0
        head = AsrHeadConfig(
            ctc_weight=ctc_weight, las=las, inter_ctc_weight=task.inter_ctc_weight, inter_ctc_layer=task.inter_ctc_layer
        )
        return AsrModel(encoder, vocab_size, head)
    if task.kind == "bestrq":
        from usmkit.ssl.bestrq import BestRQConfig, BestRQModel

        return BestRQModel(encoder, BestRQConfig(**task.bestrq), input_dim=encoder_cfg.input_dim)
    if task.kind == "most":
        from usmkit.ssl.bestrq import BestRQConfig
        from usmkit.ssl.most import MostModel

        return MostModel(encoder, vocab_size, task.most, BestRQConfig(**task.bestrq), input_dim=encoder_cfg.input_dim)
    raise ValueError(f"unknown task.kind {task.kind!r}; choose ctc, las, bestrq or most")


def check_task(task: TaskConfig, encoder_cfg: ConformerConfig) -> None:
    """ValueError if the task's settings do not fit the encoder's (checked before any data is read)."""
    if task.kind == "bestrq":
        from usmkit.ssl.bestrq import BestRQConfig, check_stack_frames

        check_stack_frames(BestRQConfig(**task.bestrq), encoder_cfg.subsampling_factor)


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
    time axis comes in a few padded lengths (``data.pad_to_frames``) and stays static. A MOST step
    (``MostBatch``): those of its audio batches."""
    if not isinstance(batch, Batch):
        return [
            axis for part in (batch.unlabeled, batch.paired) if part is not None for axis in batch_dynamic_axes(part)
        ]
    return [(batch.features, 0), (batch.feature_lens, 0), (batch.tokens, 0), (batch.token_lens, 0), (batch.tokens, 1)]
