"""int8 weights for CPU inference: dynamic quantization of every ``nn.Linear``.

A streaming chunk is a few frames (16 encoder frames at 640 ms), so each ``nn.Linear`` is a skinny
matmul whose time goes to reading its fp32 weights. ``torch.ao.quantization.quantize_dynamic`` stores those weights
as int8 (4x fewer bytes) and quantizes each activation on the fly (fbgemm/oneDNN int8 kernels, VNNI
where the CPU has it). Convolutions, norms and attention stay fp32. The accuracy cost is measured in
``tests/streaming/test_quantize.py`` (stream output against the fp32 model) and in ``bench/streaming.py``.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn


def quantize_linear_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode, CPU) whose ``nn.Linear`` layers have int8 weights.

    The original is left untouched. Only for CPU inference: the quantized layers have no backward
    and no CUDA kernels.
    """
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 dynamic quantization runs on the CPU only; load the model with device=cpu")
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; the API works
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
