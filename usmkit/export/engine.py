"""Run an exported model in the streaming pipeline: an engine in place of the PyTorch encoder step.

Shapes: B batch, C chunk size (encoder frames), F feature bins, D model dim, V vocabulary.

``OnnxStreamStep`` (onnxruntime) and ``AotiStreamStep`` (an AOTInductor package) have the call
signature of ``usmkit.streaming.step.stream_step`` and of the traced step,
``(encoder, chunk (B, 4C, F), state, lengths (B,)) -> (enc (B, C, D), out_lens (B,), new state)``, so
``StreamingEncoder(encoder, step=engine)`` runs them: only the encoder step changes, the features,
endpointing and decoding stay those of ``usmkit.streaming.pipeline``.

``load_export`` rebuilds what the pipeline needs from an export directory alone: an
``ExportedModel`` (the encoder's config, with no weights, and the CTC head, read from the export's
``ctc_head.safetensors``), the tokenizer, the feature config and statistics, and the engine, after
checking every file against the SHA-256 in the manifest; ``LoadedExport.word_decoder`` loads the
bundled lexicon and word LM for lexicon finals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from usmkit.data.config import FeatureConfig
from usmkit.data.normalize import FeatureStats
from usmkit.data.tokenizer import Tokenizer
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder, LMReadError
from usmkit.export.graphs import STEP_INPUTS, STEP_OUTPUTS
from usmkit.export.manifest import LEXICON_DIR, ExportError, ExportManifest, read_manifest, verify_files
from usmkit.models.config import ConformerConfig
from usmkit.models.ctc import CTCHead
from usmkit.models.subsampling import output_lengths
from usmkit.streaming.features import load_feature_stats
from usmkit.streaming.step import EncoderStreamState, chunk_lengths

PIPELINE_OUTPUTS = tuple(n for n in STEP_OUTPUTS if n != "log_probs")  # the pipeline applies the CTC head itself


def _check_chunking(state: EncoderStreamState, manifest: ExportManifest) -> None:
    if (state.chunk_size, state.left_chunks) != (manifest.chunk_size, manifest.left_chunks):
        raise ValueError(
            f"the exported step was made for chunk_size={manifest.chunk_size}, left_chunks={manifest.left_chunks}, "
            f"not chunk_size={state.chunk_size}, left_chunks={state.left_chunks}"
        )


class OnnxStreamStep:
    """The exported streaming step under onnxruntime (CPU), a drop-in for ``stream_step``."""

    def __init__(self, path: Path, manifest: ExportManifest, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.manifest = manifest
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own types for a damaged or foreign file
            raise ExportError(f"onnxruntime cannot load {path} ({type(e).__name__}: {e}); export again") from e
        names = tuple(i.name for i in self.session.get_inputs())
        if names != STEP_INPUTS:
            raise ExportError(f"{path} takes inputs {names}, not a usmkit streaming step's {STEP_INPUTS}")

    def __call__(
        self, encoder, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, EncoderStreamState]:
        _check_chunking(state, self.manifest)
        lengths = chunk_lengths(chunk, state, lengths)
        inputs = (chunk, lengths, *state.tensors)
        feeds = {name: t.detach().cpu().contiguous().numpy() for name, t in zip(STEP_INPUTS, inputs, strict=True)}
        enc, out_lens, *new = (torch.from_numpy(a) for a in self.session.run(PIPELINE_OUTPUTS, feeds))
        return enc, out_lens, state.with_tensors(new)


class AotiStreamStep:
    """The exported streaming step as an AOTInductor package, a drop-in for ``stream_step``."""

    def __init__(self, path: Path, manifest: ExportManifest) -> None:
        from usmkit.export.aoti import load_aoti

        self.manifest = manifest
        try:
            self.runner = load_aoti(path)
        except Exception as e:  # a damaged package, or one made by another torch
            raise ExportError(
                f"cannot load the AOTInductor package {path} ({type(e).__name__}: {e}); export it again with "
                f"this torch ({torch.__version__}, the package's: {manifest.torch_version})"
            ) from e

    def __call__(
        self, encoder, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, EncoderStreamState]:
        _check_chunking(state, self.manifest)
        lengths = chunk_lengths(chunk, state, lengths)
        inputs = [t.contiguous() for t in (chunk, lengths, *state.tensors)]  # the package reads dense rows
        with torch.no_grad():
            enc, _, out_lens, *new = self.runner(*inputs)
        return enc, out_lens, state.with_tensors(new)


class ExportedEncoder(nn.Module):
    """The encoder's place in the pipeline when an engine runs the step: its config only, no weights
    (``StreamingEncoder`` reads the chunking and state shapes from ``cfg``)."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.subsampling_factor = cfg.subsampling_factor

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Encoder frames for ``lengths`` feature frames, (B,) -> (B,)."""
        return output_lengths(lengths, self.subsampling_factor, self.cfg.front_end)


class ExportedModel(nn.Module):
    """What ``StreamingTranscriber`` takes as ``model``, for an exported model: ``encoder`` (config
    only), ``ctc`` (the exported CTC head) and no LAS decoder (rescoring needs the checkpoint)."""

    las = None

    def __init__(self, encoder_cfg: ConformerConfig, ctc: CTCHead) -> None:
        super().__init__()
        self.encoder = ExportedEncoder(encoder_cfg)
        self.ctc = ctc


@dataclass(frozen=True)
class LoadedExport:
    """An export directory ready for the streaming pipeline."""

    model: ExportedModel
    step: OnnxStreamStep | AotiStreamStep
    tokenizer: Tokenizer
    features: FeatureConfig
    stats: FeatureStats
    manifest: ExportManifest
    path: Path

    def lexicon_config(self, **changes) -> LexiconConfig:
        """The bundled lexicon's settings with ``changes`` (None values keep the bundled one), its LM the bundled
        file; ``ExportError`` for an export made without a lexicon."""
        bundle = self.manifest.lexicon
        if bundle is None:
            raise ExportError(
                f"{self.path} holds no lexicon (the training transcripts of {self.manifest.source_checkpoint} could "
                "not be read when it was exported); export it again where its training manifests are"
            )
        changes = {k: v for k, v in changes.items() if v is not None}
        try:
            return replace(bundle.config, lm_path=str(self.path / bundle.lm) if bundle.lm else None, **changes)
        except (TypeError, ValueError) as e:
            raise ExportError(f"lexicon settings {changes}: {e}") from e

    def word_decoder(self, bias=(), **changes) -> LexiconDecoder:
        """The bundled lexicon and word LM as a ``LexiconDecoder`` (lexicon finals), with the settings of
        ``lexicon_config(**changes)``, e.g. ``lm_weight=0.8``, and the ``bias`` phrases if any
        (``usmkit.decoding.biasing``)."""
        cfg = self.lexicon_config(**changes)
        try:
            return LexiconDecoder(self.tokenizer, self.path / LEXICON_DIR, cfg, bias)
        except LMReadError as e:
            raise ExportError(
                f"{cfg.lm_path} (export.json's lexicon.lm) cannot be read as an ARPA or KenLM binary LM; export the "
                "checkpoint again"
            ) from e


def load_export(directory: str | Path, threads: int | None = None) -> LoadedExport:
    """Load the export in ``directory`` (its format from the manifest), every file checked against its
    SHA-256; raises ``ExportError``."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    verify_files(directory, manifest)
    weights = load_file(str(directory / manifest.ctc_head))  # proj.weight (V, D), proj.bias (V,)
    ctc = CTCHead(manifest.encoder.d_model, manifest.vocab_size)
    try:
        ctc.load_state_dict(weights)
        stats = load_feature_stats(directory / manifest.feature_stats, manifest.features)
    except (RuntimeError, ValueError) as e:
        raise ExportError(f"{directory} does not hold a consistent export ({e}); export the checkpoint again") from e
    path = directory / manifest.stream_step.file
    step = OnnxStreamStep(path, manifest, threads) if manifest.format == "onnx" else AotiStreamStep(path, manifest)
    return LoadedExport(
        model=ExportedModel(manifest.encoder, ctc.eval()).eval(),
        step=step,
        tokenizer=Tokenizer.load(directory / manifest.tokenizer),
        features=manifest.features,
        stats=stats,
        manifest=manifest,
        path=directory,
    )
