"""``export.json``: what an exported model is and how to feed it, so an engine needs no checkpoint.

The manifest is plain JSON (no pickle), read back into the typed ``ExportManifest`` by
``usmkit.config.from_dict`` (unknown keys and wrong types are refused, naming them). It names the
files beside it (the two graphs, the tokenizer, the feature statistics, the CTC head's weights),
the inputs and outputs of each graph in call order with their shapes ("batch" and "frames" are the
dynamic axes) and dtypes, the chunking the streaming step was exported with, and the feature and
encoder configs. ``lexicon`` names the bundled lexicon decoding (``LexiconFiles``: the lexicon and word
LM of the checkpoint's training transcripts, and the settings they decode with), and ``sha256`` holds
the SHA-256 of every file of the export, checked when it is loaded (``verify_files``).

Every name is a path inside the export's folder: ``read_manifest`` refuses an absolute path, a ``..``, or
a link that leads out of the folder, naming the key, before any file is opened; a version-2 manifest must
list the SHA-256 of every file it names. Version 1 manifests (no lexicon, no SHA-256) are still read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from usmkit.checkpointing.checkpoint import file_record
from usmkit.config import ConfigError, from_dict, to_dict
from usmkit.data.config import FeatureConfig
from usmkit.decoding.ctc_lexicon import LEXICON_DIR, LEXICON_FILE, TOKENS_FILE, LexiconConfig
from usmkit.errors import UsageError
from usmkit.models.config import ConformerConfig

MANIFEST_FILE = "export.json"
MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, MANIFEST_VERSION)  # 1: no lexicon, no SHA-256

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
class LexiconFiles:
    """The bundled lexicon decoding (``usmkit.decoding.ctc_lexicon.LexiconDecoder``), files beside the
    manifest: ``tokens`` (the tokenizer's pieces), ``lexicon`` (each word spelled in pieces), ``lm`` (the
    word LM, ARPA or KenLM binary; None with ``config.order`` 0), and the settings they decode with
    unless told otherwise (``config``; its ``lm_path`` is None: the LM is ``lm``)."""

    tokens: str
    lexicon: str
    lm: str | None
    config: LexiconConfig
    words: int  # lines of ``lexicon``
    transcripts: int  # training transcripts it was built from


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
    lexicon: LexiconFiles | None = None  # None: exported without its training transcripts (no lexicon decoding)
    sha256: dict[str, str] = field(default_factory=dict)  # every file above, by name

    def named_files(self) -> dict[str, str]:
        """The files the manifest names, beside it, by their key in ``export.json``."""
        named = {
            "stream_step.file": self.stream_step.file,
            "offline.file": self.offline.file,
            "tokenizer": self.tokenizer,
            "feature_stats": self.feature_stats,
            "ctc_head": self.ctc_head,
        }
        if self.lexicon is not None:
            named |= {"lexicon.tokens": self.lexicon.tokens, "lexicon.lexicon": self.lexicon.lexicon}
            if self.lexicon.lm:
                named["lexicon.lm"] = self.lexicon.lm
        return named

    def files(self) -> tuple[str, ...]:
        """The files the manifest names, beside it."""
        return tuple(self.named_files().values())


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
    if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
        version = data.get("version") if isinstance(data, dict) else None
        raise ExportError(
            f"{path} has manifest version {version!r}, this usmkit reads versions {READABLE_VERSIONS}: export the "
            "checkpoint again with this usmkit"
        )
    try:
        manifest = from_dict(ExportManifest, data)
    except ConfigError as e:
        raise ExportError(f"{path} is not a usmkit export manifest: {e}") from e
    named = manifest.named_files() | {f"sha256[{name!r}]": name for name in manifest.sha256}
    for key, name in named.items():
        check_inside(directory, name, f"{path}: {key}")
    _check_bundle_layout(manifest, path)
    if manifest.version >= 2:
        unlisted = [name for name in manifest.files() if name not in manifest.sha256]
        if unlisted:
            raise ExportError(
                f"{path}: sha256 lists no SHA-256 for {', '.join(unlisted)}: a version-{manifest.version} export "
                "records one for every file it names, so a changed file is caught; copy the export again or export "
                "the checkpoint again"
            )
    for name in manifest.files():
        if not (directory / name).is_file():
            raise ExportError(f"{directory / name} is missing (named by {path}); export the checkpoint again")
    return manifest


def check_inside(directory: Path, name: str, key: str) -> Path:
    """``directory / name``, refused (``ExportError`` naming ``key``) unless it lies inside ``directory``: no
    absolute path, no ``..``, no link leading out. Judged by the names alone; nothing is opened.

    >>> check_inside(Path("/exp/export_onnx"), "lexicon/lm.arpa", "lexicon.lm")
    PosixPath('/exp/export_onnx/lexicon/lm.arpa')
    """
    parts = PurePosixPath(name).parts
    if not name or PurePosixPath(name).is_absolute() or "\\" in name or ".." in parts or Path(name).is_absolute():
        raise ExportError(
            f"{key}={name!r} is not a file inside the export folder: an export names only files in its own folder "
            "(no absolute paths, no ..); export the checkpoint again"
        )
    target = Path(directory) / name
    root = Path(directory).resolve()
    if not target.resolve().is_relative_to(root):
        raise ExportError(
            f"{key}={name!r} leads out of the export folder (a link to {target.resolve()}): an export holds its "
            "own files; copy the export again without links"
        )
    return target


def _check_bundle_layout(manifest: ExportManifest, path: Path) -> None:
    """The lexicon's files where the engine reads them: ``lexicon/tokens.txt``, ``lexicon/lexicon.txt`` and an LM
    in ``lexicon/`` (``LexiconDecoder`` reads the folder)."""
    bundle = manifest.lexicon
    if bundle is None:
        return
    expected = {
        "lexicon.tokens": (bundle.tokens, f"{LEXICON_DIR}/{TOKENS_FILE}"),
        "lexicon.lexicon": (bundle.lexicon, f"{LEXICON_DIR}/{LEXICON_FILE}"),
    }
    for key, (name, where) in expected.items():
        if name != where:
            raise ExportError(f"{path}: {key}={name!r}, where an export's lexicon holds it as {where!r}")
    if bundle.lm is not None and PurePosixPath(bundle.lm).parent != PurePosixPath(LEXICON_DIR):
        raise ExportError(f"{path}: lexicon.lm={bundle.lm!r}, where an export's LM lies in {LEXICON_DIR}/")


def file_digests(directory: Path, names) -> dict[str, str]:
    """SHA-256 of the files ``names`` in ``directory``, by name (what ``ExportManifest.sha256`` holds)."""
    return file_record(Path(directory), names)["sha256"]


def verify_files(directory: str | Path, manifest: ExportManifest) -> None:
    """Check every file the manifest names against its recorded SHA-256 (none recorded: version 1, nothing
    to check); ``ExportError`` naming the first that differs."""
    directory = Path(directory)
    for name, digest in manifest.sha256.items():
        if not (directory / name).is_file():
            raise ExportError(f"{directory / name} is missing (listed in {directory / MANIFEST_FILE})")
        if file_digests(directory, [name])[name] != digest:
            raise ExportError(
                f"{directory / name} is damaged: its SHA-256 does not match the one in {MANIFEST_FILE} (changed "
                "since it was exported); copy the export again or export the checkpoint again"
            )
