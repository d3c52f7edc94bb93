"""Export a trained streaming CTC checkpoint: its two graphs, tokenizer, feature stats, lexicon and manifest.

``export_checkpoint`` loads the checkpoint as ``usmkit-transcribe`` does (``load_model``: a CTC head,
feature statistics, global normalization), writes everything into a temporary directory beside
``out`` and renames it into place, so an interrupted export leaves no half-written directory.

The lexicon and word LM are the ones ``usmkit-transcribe --checkpoint ... --lexicon`` builds from the
checkpoint's training transcripts (``usmkit.runs.lexicon_texts`` -> ``LexiconDecoder.build``), written
into the export's ``lexicon/`` folder once, so that an engine decodes with them without the corpus. A
checkpoint whose training transcripts cannot be read is exported without them, with a warning.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from usmkit.checkpointing.atomic import replaced_dir_atomically
from usmkit.checkpointing.checkpoint import run_dir
from usmkit.checkpointing.output_dir import check_output_dir
from usmkit.data.normalize import STATS_FILE
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.decoding.ctc_lexicon import (
    LEXICON_FILE,
    LM_FILE,
    STREAMING_LEXICON,
    TOKENS_FILE,
    LexiconConfig,
    LexiconDecoder,
)
from usmkit.export.graphs import (
    OFFLINE_INPUTS,
    OFFLINE_OUTPUTS,
    STEP_INPUTS,
    STEP_OUTPUTS,
    OfflineGraph,
    StreamStepGraph,
)
from usmkit.export.manifest import (
    LEXICON_DIR,
    MANIFEST_FILE,
    ExportError,
    ExportManifest,
    Format,
    GraphSpec,
    LexiconFiles,
    Quantize,
    TensorSpec,
    file_digests,
    write_manifest,
)
from usmkit.models.ctc import BLANK_ID
from usmkit.models.subsampling import feature_context
from usmkit.runs import lexicon_texts, load_trained
from usmkit.streaming.pipeline import ModelError, load_model
from usmkit.streaming.step import NotStreamableError, check_streamable

CTC_HEAD_FILE = "ctc_head.safetensors"
EXPORTABLE_ATTENTION = ("sdpa", "reference")  # flex and triton are training kernels; both graphs run SDPA

log = logging.getLogger(__name__)


def default_out(checkpoint: Path, fmt: Format, quantize: Quantize) -> Path:
    """``<exp_dir>/export_<format>[_int8]``: beside the run's checkpoints."""
    return run_dir(checkpoint) / f"export_{fmt}{'_int8' if quantize == 'int8' else ''}"


def _specs(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...], dynamic: dict[int, dict[int, str]]):
    """TensorSpecs of ``tensors`` with the named dynamic axes ``dynamic[i] = {axis: name}``."""
    specs = []
    for i, (name, t) in enumerate(zip(names, tensors, strict=True)):
        shape = [dynamic.get(i, {}).get(axis, size) for axis, size in enumerate(t.shape)]
        specs.append(TensorSpec(name, tuple(shape), str(t.dtype).removeprefix("torch.")))
    return tuple(specs)


def _graph_specs(step: StreamStepGraph, offline: OfflineGraph, files: tuple[str, str]) -> tuple[GraphSpec, GraphSpec]:
    """Input and output specs of both graphs, from one run of each on its example inputs (batch as "batch")."""
    step_in = step.example_inputs()
    with torch.no_grad():
        step_out = step(*step_in)
    # Batch axes: chunk, lengths, feat_ctx axis 0; kv axis 2; conv_tail axis 1 (in and out alike).
    batch_in = {0: {0: "batch"}, 1: {0: "batch"}, 2: {2: "batch"}, 4: {1: "batch"}, 5: {0: "batch"}}
    batch_out = {0: {0: "batch"}, 1: {0: "batch"}, 2: {0: "batch"}, 3: {2: "batch"}, 5: {1: "batch"}, 6: {0: "batch"}}
    off_in = offline.example_inputs()
    with torch.no_grad():
        off_out = offline(*off_in)
    cfg = offline.encoder.cfg  # usmkit.models.subsampling.output_lengths
    frames = f"frames // {cfg.subsampling_factor}" if cfg.front_end == "stack" else "(frames - 3) // 4"
    return (
        GraphSpec(files[0], _specs(STEP_INPUTS, step_in, batch_in), _specs(STEP_OUTPUTS, step_out, batch_out)),
        GraphSpec(
            files[1],
            _specs(OFFLINE_INPUTS, off_in, {0: {0: "batch", 1: "frames"}, 1: {0: "batch"}}),
            _specs(OFFLINE_OUTPUTS, off_out, {0: {0: "batch", 1: frames}, 1: {0: "batch"}}),
        ),
    )


def _prepare_out(out: Path, checkpoint: Path) -> None:
    """Refuse to replace a folder that is not an earlier export (an experiment, a checkpoint, a corpus, or
    any other non-empty folder), or one inside ``checkpoint`` or other work than its run (``check_output_dir``)."""
    check_output_dir(
        out,
        option="out=",
        own_kind="export",
        own_words="an export directory",
        own=lambda p: (p / MANIFEST_FILE).is_file(),
        inputs=[(f"the checkpoint {checkpoint}", checkpoint)],
        home=[run_dir(checkpoint)],
    )
    out.parent.mkdir(parents=True, exist_ok=True)


def _training_texts(loaded) -> list[str] | None:
    """The checkpoint's training transcripts for its lexicon, or None (with a warning) where they cannot be read."""
    try:
        return lexicon_texts(loaded.cfg)
    except (FileNotFoundError, ValueError) as e:
        log.warning(
            "exporting %s without a lexicon: its training transcripts could not be read (%s); the export decodes "
            "without --lexicon. Export it where the training manifests are to bundle them",
            loaded.checkpoint,
            e,
        )
        return None


def _is_arpa(path: Path) -> bool:
    """An ARPA LM starts with a ``\\data\\`` line (after blank lines); anything else is left to KenLM as binary."""
    with open(path, "rb") as f:
        return f.read(4096).lstrip().startswith(b"\\data\\")


def _bundle_lexicon(directory: Path, texts: list[str], tokenizer, cfg: LexiconConfig) -> LexiconFiles:
    """Write the lexicon, its tokens and word LM of ``texts`` into ``directory/lexicon`` (an ``lm_path`` LM is
    copied there) and check that they load; returns their manifest entry."""
    folder = directory / LEXICON_DIR
    LexiconDecoder.build(texts, tokenizer, folder, cfg)  # writes tokens, lexicon and LM, then loads them
    lm = LM_FILE if cfg.order > 0 else None
    if cfg.lm_path:
        lm = LM_FILE if _is_arpa(Path(cfg.lm_path)) else "lm.bin"
        shutil.copyfile(cfg.lm_path, folder / lm)
    words = sum(1 for line in (folder / LEXICON_FILE).read_text(encoding="utf-8").splitlines() if line)
    return LexiconFiles(
        tokens=f"{LEXICON_DIR}/{TOKENS_FILE}",
        lexicon=f"{LEXICON_DIR}/{LEXICON_FILE}",
        lm=f"{LEXICON_DIR}/{lm}" if lm else None,
        config=replace(cfg, lm_path=None),
        words=words,
        transcripts=len(texts),
    )


def export_checkpoint(
    checkpoint: str | Path,
    fmt: Format,
    quantize: Quantize = "none",
    out: str | Path | None = None,
    lexicon: LexiconConfig = STREAMING_LEXICON,
) -> tuple[Path, ExportManifest]:
    """Export ``checkpoint`` (a checkpoint dir or an experiment dir) as ``fmt``; returns (directory, manifest).
    ``lexicon``: the settings the bundled lexicon decodes with unless a front end is told otherwise.

    Raises ``ExportError`` (a ``UsageError``) for a checkpoint that cannot stream or be loaded.
    """
    if fmt not in ("onnx", "aoti"):
        raise ExportError(f"format={fmt!r}: use format=onnx or format=aoti")
    if quantize not in ("none", "int8"):
        raise ExportError(f"quantize={quantize!r}: use quantize=int8 or leave it out")
    if quantize == "int8" and fmt != "onnx":
        raise ExportError("quantize=int8 is onnxruntime's dynamic quantization: use it with format=onnx")
    try:
        loaded = load_model(checkpoint)
    except ModelError as e:
        raise ExportError(str(e)) from e
    model, enc_cfg = loaded.model, loaded.model.encoder.cfg
    try:
        C, K = check_streamable(enc_cfg)
    except NotStreamableError as e:
        raise ExportError(f"cannot export checkpoint {loaded.checkpoint} as a streaming model: {e}") from e
    if enc_cfg.subsampling_factor != 4 and enc_cfg.front_end != "stack":  # output-length expression: 4x or stacked
        raise ExportError(
            f"checkpoint {loaded.checkpoint} subsamples {enc_cfg.subsampling_factor}x; export supports 4x models"
        )
    if enc_cfg.attention_impl not in EXPORTABLE_ATTENTION:  # the same weights with SDPA attention
        model = load_trained(str(loaded.checkpoint), "cpu", attention_impl="sdpa")[0]
        enc_cfg = replace(enc_cfg, attention_impl="sdpa")
    out = Path(out) if out else default_out(loaded.checkpoint, fmt, quantize)
    _prepare_out(out, Path(loaded.checkpoint))
    texts = _training_texts(loaded)

    step = StreamStepGraph(model.encoder, model.ctc, C, K).eval()
    offline = OfflineGraph(model.encoder, model.ctc).eval()
    suffix = {"onnx": ".int8.onnx" if quantize == "int8" else ".onnx", "aoti": ".pt2"}[fmt]
    files = (f"stream_step{suffix}", f"offline{suffix}")
    step_spec, offline_spec = _graph_specs(step, offline, files)
    with replaced_dir_atomically(out) as tmp:
        # The lexicon first: a lexicon.lm_path that cannot be read stops the export before the graphs are made.
        bundle = _bundle_lexicon(tmp, texts, loaded.tokenizer, lexicon) if texts is not None else None
        for graph, name, inputs, outputs in (
            (step, files[0], STEP_INPUTS, STEP_OUTPUTS),
            (offline, files[1], OFFLINE_INPUTS, OFFLINE_OUTPUTS),
        ):
            _write_graph(graph, tmp, name, fmt, quantize, inputs, outputs)
        (tmp / TOKENIZER_FILE).write_bytes(loaded.tokenizer.model_proto)
        features = loaded.cfg.data.features
        loaded.stats.save(tmp / STATS_FILE, features)
        save_file({k: v.contiguous() for k, v in model.ctc.state_dict().items()}, str(tmp / CTC_HEAD_FILE))
        every_file = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = ExportManifest(
            format=fmt,
            quantize=quantize,
            stream_step=step_spec,
            offline=offline_spec,
            chunk_size=C,
            left_chunks=K,
            chunk_input_frames=enc_cfg.subsampling_factor * C,
            feature_context=feature_context(enc_cfg.subsampling_factor, enc_cfg.front_end),
            vocab_size=model.ctc.vocab_size,
            blank_id=BLANK_ID,
            tokenizer=TOKENIZER_FILE,
            feature_stats=STATS_FILE,
            ctc_head=CTC_HEAD_FILE,
            features=features,
            encoder=enc_cfg,
            source_checkpoint=str(loaded.checkpoint),
            torch_version=torch.__version__,
            lexicon=bundle,
            sha256=file_digests(tmp, every_file),
        )
        write_manifest(manifest, tmp)
    return out, manifest


def _write_graph(graph, directory: Path, name: str, fmt: Format, quantize: Quantize, inputs, outputs) -> None:
    example, dynamic = graph.example_inputs(), graph.dynamic_shapes()
    if fmt == "aoti":
        from usmkit.export.aoti import export_aoti

        export_aoti(graph, example, directory / name, dynamic)
        return
    from usmkit.export.onnx import export_onnx, quantize_int8

    if quantize == "none":
        export_onnx(graph, example, directory / name, inputs, outputs, dynamic)
        return
    fp32 = directory / "fp32" / name.replace(".int8", "")
    fp32.parent.mkdir()
    export_onnx(graph, example, fp32, inputs, outputs, dynamic)
    quantize_int8(fp32, directory / name)
    shutil.rmtree(fp32.parent)
