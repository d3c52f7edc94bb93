"""``export.json``: what an exported model is and how to feed it, so an engine needs no checkpoint.

The manifest is plain JSON (no pickle), read back into the typed ``ExportManifest`` by
``usmkit.config.from_dict`` (unknown keys and wrong types are refused, naming them). It names the
files beside it (the two graphs, the tokenizer, the feature statistics, the CTC head's weights),
the inputs and outputs of each graph in call order with their shapes ("batch" and "frames" are the
dynamic axes) and dtypes, the chunking the streaming step was exported with, and the feature and
encoder configs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from usmkit.config import ConfigError, from_dict, to_dict
from usmkit.data.config import FeatureConfig
from usmkit.errors import UsageError
from usmkit.models.config import ConformerConfig

MANIFEST_FILE = "export.json"
MANIFEST_VERSION = 1

Format = Literal["onnx", "aoti"]
Quantize = Literal["none", "int8"]


class ExportError(UsageError, ValueError):
    """An export that cannot be made or an export directory that cannot be used; the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a graph: its name, shape (ints, or a name for a dynamic axis) and dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str  # "float32" | "int64"


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its file (beside the manifest) and its inputs and outputs, in call order."""

    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class ExportManifest:
    format: Format
    quantize: Quantize
    stream_step: GraphSpec
    offline: GraphSpec
    chunk_size: int  # encoder frames per streaming step (40 ms each)
    left_chunks: int  # chunks of attention history in the step's cache
    chunk_input_frames: int  # feature frames one step consumes: 4 chunk_size
    feature_context: int  # feature frames the stream's initial state holds (feat_ctx): 3
    vocab_size: int
    blank_id: int
    tokenizer: str  # sentencepiece model file, beside the manifest
    feature_stats: str  # safetensors: mean and std (F,) of the features the model was trained on
    ctc_head: str  # safetensors: proj.weight (V, D), proj.bias (V,), the CTC head inside both graphs
    features: FeatureConfig
    encoder: ConformerConfig
    source_checkpoint: str
    torch_version: str
    version: int = MANIFEST_VERSION


def write_manifest(manifest: ExportManifest, directory: Path) -> Path:
    path = Path(directory) / MANIFEST_FILE
    text = json.dumps(to_dict(manifest), indent=2)
    text = re.sub(
        r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text
    )  # shapes on one line
    path.write_text(text + "\n")
    return path


def read_manifest(directory: str | Path) -> ExportManifest:
    """The manifest of an export directory, with every file it names present; raises ``ExportError``."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise ExportError(
            f"{directory} is not an export directory: no {MANIFEST_FILE} in it (make one with "
            "python -m usmkit.cli.export checkpoint=EXP format=onnx out=DIR)"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ExportError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise ExportError(
            f"{path} has manifest version {version!r}, this usmkit reads version {MANIFEST_VERSION}: export the "
            "checkpoint again with this usmkit"
        )
    try:
        manifest = from_dict(ExportManifest, data)
    except ConfigError as e:
        raise ExportError(f"{path} is not a usmkit export manifest: {e}") from e
    for name in (manifest.stream_step.file, manifest.offline.file, manifest.tokenizer, manifest.feature_stats,
                 manifest.ctc_head):  # fmt: skip
        if not (directory / name).is_file():
            raise ExportError(f"{directory / name} is missing (named by {path}); export the checkpoint again")
    return manifest
