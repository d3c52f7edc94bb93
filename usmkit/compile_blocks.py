"""Compile a model's encoder block by block (``trainer.compile_scope=blocks``).

Shapes: B batch, T frames, D model dim.

``torch.compile`` of the whole training step traces and compiles every layer of the unrolled model:
minutes for a deep encoder, again for each padded length. Compiling each Conformer block and the
subsampling front end on their own compiles one graph that every identical block reuses; the glue
between them (masks, rotary tables, heads, losses) stays eager. Compiled this way, ``small`` took
43 s instead of 220 s to compile on the 2-core CI CPU (``bench/results/compile_scope.json``); in
``bench/train_throughput.py`` (which also compiles the CTC head) the 392M ``large`` compiled in 32 s
instead of 130 s on an H100 and stepped in 91.4 instead of 98.3 ms with CUDA graphs
(``bench/results/train_throughput_cudagraphs.json``). In the trainer on real batches (``base``,
H200, ``bench/results/trainer_compile.json``) it logged step 10 after 76 s against 367 s for the
whole model, then ran 1.38x eager's frames/s; hence the default ``trainer.compile_scope=blocks``.

Only training uses the compiled forward (module in training mode, gradients on): evaluation in the
same process runs the eager forward, so its varying shapes never recompile. As in the whole-model
compile, the time axis stays static (``data.pad_to_frames`` gives a few lengths) and the batch axis
is marked dynamic, so a new batch size does not recompile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from usmkit.models.conformer import ConformerBlock
from usmkit.models.subsampling import Conv2dSubsampling

BLOCK_TYPES = (ConformerBlock, Conv2dSubsampling)


class _TrainingForward:
    """A module's forward that runs compiled while training, eager otherwise."""

    def __init__(self, module: nn.Module, mode: str | None) -> None:
        self.module = module
        self.eager: Callable[..., Any] = module.forward
        self.compiled = torch.compile(module.forward, dynamic=False, mode=mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.module.training and torch.is_grad_enabled()):
            return self.eager(*args, **kwargs)
        for a in args:  # every tensor argument of these blocks is batch-first: (B, ...)
            if isinstance(a, torch.Tensor):
                torch._dynamo.maybe_mark_dynamic(a, 0)
        return self.compiled(*args, **kwargs)


def compile_blocks(model: nn.Module, mode: str | None = None) -> int:
    """Compile the forward of every Conformer block and subsampling front end in ``model`` (in place).

    Returns how many modules were compiled; raises ``ValueError`` if there are none.
    """
    blocks = [m for m in model.modules() if isinstance(m, BLOCK_TYPES)]
    if not blocks:
        raise ValueError(
            f"trainer.compile_scope=blocks found no Conformer block in {type(model).__name__}; "
            "use trainer.compile_scope=whole"
        )
    for m in blocks:
        m.forward = _TrainingForward(m, mode)  # an instance attribute: nn.Module.__call__ calls it
    return len(blocks)
