"""Activation checkpointing per block (``trainer.activation_checkpointing=true``).

Shapes: B batch, T' frames, D model dim.

A block's forward saves its intermediate activations for the backward: tens of (B, T', D) tensors per
Conformer block, which for the large presets outgrow the weights and optimizer state. Checkpointing
keeps only the block's inputs and runs its forward again during the backward
(``torch.utils.checkpoint``, non-reentrant), trading one more forward of each block (about a third
more compute per step) for that memory. The random state is restored for the recomputation, so
dropout draws the same masks and the gradients equal the plain step's.

Like ``usmkit.training.compile_blocks`` it replaces each unit's ``forward`` in place (the task names the
units: ``TrainSpec.checkpoint_units``), so parameter names, state dicts and checkpoints are unchanged.
Apply it after ``compile_blocks``: the checkpoint then wraps the compiled forward, which runs once in
the forward pass and again in the backward. (Compiling a forward that holds the checkpoint fails in
inductor's partitioner when the block has dropout.) A whole-model ``torch.compile`` applied afterwards
traces the checkpointed blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class _CheckpointedForward:
    """A module's forward that recomputes its activations in the backward while training."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.inner: Callable[..., Any] = module.forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.module.training and torch.is_grad_enabled()):
            return self.inner(*args, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(blocks: Sequence[nn.Module]) -> int:
    """Checkpoint the activations of each module in ``blocks`` (in place); returns how many.

    Raises ``ValueError`` if there are none (the task names no units).
    """
    if not blocks:
        raise ValueError(
            "trainer.activation_checkpointing=true: the task names no blocks to checkpoint "
            "(TrainSpec.checkpoint_units is empty)"
        )
    for m in blocks:
        m.forward = _CheckpointedForward(m)  # an instance attribute: nn.Module.__call__ calls it
    return len(blocks)
