"""AOTInductor packages of the export graphs: ``torch.export`` then ``aoti_compile_and_package``.

A ``.pt2`` package holds the graph compiled ahead of time by inductor into a shared library (C++ for
the CPU, built with the machine's C++ compiler) and its weights; ``torch._inductor.aoti_load_package``
loads it in any process with the same torch, without Python model code or the checkpoint. The
package is compiled for the CPU it is made on (its vector instructions): make it on the kind of
machine it will run on. Compiling takes from tens of seconds (``tiny``) to minutes on a CPU.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import nn


def export_aoti(graph: nn.Module, example: tuple[torch.Tensor, ...], path: Path, dynamic_shapes: dict) -> None:
    """Compile ``graph`` traced on ``example`` (dynamic axes ``dynamic_shapes``) into the package ``path``."""
    cpp = logging.getLogger("torch.utils.cpp_extension")  # warns that no CUDA runtime is found: irrelevant here
    level = cpp.level
    cpp.setLevel(logging.ERROR)
    try:
        _compile(graph, example, path, dynamic_shapes)
    finally:
        cpp.setLevel(level)


def _compile(graph: nn.Module, example: tuple[torch.Tensor, ...], path: Path, dynamic_shapes: dict) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notes of torch.export internals
        # Guards the shape solver cannot prove over the whole dynamic range (e.g. that a time axis is not
        # 1) become assertions checked at run time instead of refusing the export.
        program = torch.export.export(
            graph, example, dynamic_shapes=dynamic_shapes, prefer_deferred_runtime_asserts_over_guards=True
        )
        # freezing: the weights are constants of the compiled graph, so inductor folds what depends only on
        # them and lays out the linear weights for its matmul kernels once, at compile time.
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs={"freezing": True})


def load_aoti(path: Path):
    """The compiled graph of package ``path``: called with the graph's inputs, returns its outputs (a list).

    Pass contiguous tensors: the compiled code indexes its inputs as dense row-major arrays and does not
    check their strides (a slice such as ``features[:, :3]`` of a batch of several rows reads wrong rows).
    """
    return torch._inductor.aoti_load_package(str(path))
