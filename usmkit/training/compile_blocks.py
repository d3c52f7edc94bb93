"""Compile a model block by block (``trainer.compile_scope=blocks``).

Shapes: B batch, T frames, D model dim.

``torch.compile`` of the whole training step traces and compiles every layer of the unrolled model:
minutes for a deep encoder, again for each padded length. Compiling each block (the task names them:
``TrainSpec.compile_units``, e.g. every Conformer block and the subsampling front end) compiles one
graph that every identical block reuses; the glue between them (masks, rotary tables, heads, losses)
stays eager. It compiles several times faster than the whole model and steps about as fast
(``experiments/compile_scope``), hence the default ``trainer.compile_scope=blocks``.

Only training uses the compiled forward (module in training mode, gradients on): evaluation in the
same process runs the eager forward, so its varying shapes never recompile. As in the whole-model
compile, the time axis stays static (``data.pad_to_frames`` gives a few lengths) and the batch axis
is marked dynamic, so a new batch size does not recompile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


class _TrainingForward:
    """A module's forward that runs compiled while training, eager otherwise."""

    def __init__(self, module: nn.Module, mode: str | None) -> None:
        self.module = module
        self.eager: Callable[..., Any] = module.forward
        self.compiled = torch.compile(module.forward, dynamic=False, mode=mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.module.training and torch.is_grad_enabled()):
            return self.eager(*args, **kwargs)
        for a in args:  # a compile unit's tensor arguments are batch-first: (B, ...)
            if isinstance(a, torch.Tensor):
                torch._dynamo.maybe_mark_dynamic(a, 0)
        return self.compiled(*args, **kwargs)


def compile_blocks(blocks: Sequence[nn.Module], mode: str | None = None) -> int:
    """Compile the forward of each module in ``blocks`` (in place), for training; returns how many.

    Each module's forward must take its tensor arguments batch-first. Raises ``ValueError`` if there
    are none.
    """
    if not blocks:
        raise ValueError(
            "trainer.compile_scope=blocks: the task names no blocks to compile (TrainSpec.compile_units is "
            "empty); use trainer.compile_scope=whole"
        )
    for m in blocks:
        m.forward = _TrainingForward(m, mode)  # an instance attribute: nn.Module.__call__ calls it
    return len(blocks)
