"""Builds the module a recipe trains (``Batch -> StepOutput``) from its task and encoder configs.

This is where configuration meets model classes: one explicit branch per task kind.
"""

from __future__ import annotations

import torch

from usmkit.config import TaskConfig
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder


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
    raise ValueError(f"unknown task.kind {task.kind!r}; choose ctc, las or bestrq")
