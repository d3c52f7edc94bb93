"""Exported models: a trained streaming CTC checkpoint as ONNX or AOTInductor graphs, and engines that run them.

    python -m usmkit.cli.export checkpoint=exp/demo_ctc format=onnx [quantize=int8] [out=DIR]
    usmkit-transcribe talk.wav --engine onnx --model exp/demo_ctc/export_onnx

An export directory holds two graphs (``usmkit.export.graphs``: the streaming step with its state as
named inputs and outputs, and the offline encoder + CTC head), the tokenizer, the feature statistics,
the CTC head's weights and ``export.json`` (``usmkit.export.manifest``), which names them all with
their inputs, outputs and shapes: enough to run the model without the checkpoint or usmkit's model code.
``usmkit.export.engine`` plugs the exported step into the streaming pipeline in place of PyTorch's.
``docs/export.md`` is the user guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from usmkit.export.build import export_checkpoint
    from usmkit.export.engine import LoadedExport, load_export
    from usmkit.export.manifest import MANIFEST_FILE, ExportError, ExportManifest, read_manifest

_WHERE = {
    "export_checkpoint": "build",
    "LoadedExport": "engine",
    "load_export": "engine",
    "MANIFEST_FILE": "manifest",
    "ExportError": "manifest",
    "ExportManifest": "manifest",
    "read_manifest": "manifest",
}
__all__ = [
    "MANIFEST_FILE",
    "ExportError",
    "ExportManifest",
    "LoadedExport",
    "export_checkpoint",
    "load_export",
    "read_manifest",
]


def __getattr__(name: str):
    # Imported on first use, so that ``python -m usmkit.cli.export`` runs ``__main__``'s first import
    # (usmkit.cli) before torch loads.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"usmkit.export.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
