"""Builds the module a recipe trains (``Batch -> StepOutput``) from its typed config.

This is where configuration meets model classes: one explicit branch per task kind in ``build_task``.
What the trainer must know of the module comes from ``usmkit.training.task_spec``.
"""

from __future__ import annotations

import torch

from usmkit.config import TaskConfig
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.ssl.bestrq import BestRQModel, check_stack_frames
from usmkit.ssl.most import MostModel


def build_task(task: TaskConfig, encoder_cfg: ConformerConfig, vocab_size: int) -> torch.nn.Module:
    encoder = ConformerEncoder(encoder_cfg)
    if task.kind in ("ctc", "las"):
        las = task.las if task.kind == "las" else None
        ctc_weight = task.ctc_weight if task.kind == "las" else 1.0
        head = AsrHeadConfig(
            ctc_weight=ctc_weight, las=las, inter_ctc_weight=task.inter_ctc_weight, inter_ctc_layer=task.inter_ctc_layer
        )
        return AsrModel(encoder, vocab_size, head)
    if task.kind == "bestrq":
        return BestRQModel(encoder, task.bestrq, input_dim=encoder_cfg.input_dim)
    if task.kind == "most":
        return MostModel(encoder, vocab_size, task.most, task.bestrq, input_dim=encoder_cfg.input_dim)
    raise ValueError(f"unknown task.kind {task.kind!r}; choose ctc, las, bestrq or most")


def check_task(task: TaskConfig, encoder_cfg: ConformerConfig) -> None:
    """ValueError if the task's settings do not fit the encoder's (checked before any data is read)."""
    if task.kind == "bestrq":
        check_stack_frames(task.bestrq, encoder_cfg.subsampling_factor)
