"""ONNX files of the export graphs (``torch.onnx.export``, the dynamo exporter) and their int8 copies.

Why the dynamo exporter (``dynamo=True``, torch.export + onnxscript): the TorchScript exporter fails
on the streaming step's padding of the convolution context, while ``torch.export`` traces both graphs
with a dynamic batch (and time) axis. Weights go inside the ``.onnx`` file up to ``EXTERNAL_DATA_BYTES``
of parameters, into ``<file>.data`` beside it above (protobuf's 2 GB limit).

int8: onnxruntime's dynamic quantization (``quantize_dynamic``) of the weights of every ``MatMul`` /
``Gemm`` with a constant weight, i.e. the linear layers: weights stored as int8, each activation
quantized on the fly (``MatMulInteger``). Attention (whose operands are both activations),
convolutions and norms stay float32, as with ``usmkit.streaming.quantize`` in PyTorch. Weights are
quantized per output channel to 7 bits (``per_channel``, ``reduce_range``): on x86 CPUs without VNNI,
onnxruntime multiplies uint8 activations by int8 weights with an instruction whose 16-bit pair sums
saturate at full 8-bit range, which moves log-probs by whole units; the spare bit keeps those sums in
range, so an export is as close to fp32 on any CPU that runs it as on the one that made it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

EXTERNAL_DATA_BYTES = 1 << 30


def _parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines and warnings (missing torchvision ops, deprecations) are not the user's."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "root", "")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_onnx(
    graph: nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    dynamic_shapes: dict,
) -> Path | None:
    """Write ``graph`` traced on ``example`` to ``path``; returns the external data file, or None (weights inside)."""
    external = _parameter_bytes(graph) > EXTERNAL_DATA_BYTES
    with torch.no_grad(), _quiet():
        torch.onnx.export(
            graph,
            example,
            str(path),
            dynamo=True,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            external_data=external,
        )
    data = path.with_name(path.name + ".data")
    return data if external and data.is_file() else None


def quantize_int8(source: Path, target: Path) -> Path | None:
    """int8 weights of the linear layers of ``source`` -> ``target``; returns its external data file or None."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    external = source.with_name(source.name + ".data").is_file()
    with _quiet():  # it logs a suggestion to pre-process the model (shape inference; the graph has its shapes)
        quantize_dynamic(
            source,
            target,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul", "Gemm"],
            use_external_data_format=external,
        )
    data = target.with_name(target.name + ".data")
    return data if external and data.is_file() else None
