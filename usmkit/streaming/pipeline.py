"""The streaming audio -> text pipeline: feature frames, encoder chunks, CTC, the streaming decoder.

Shapes: N samples, t feature frames (10 ms), n encoder frames (40 ms), D model dim, V vocabulary.

samples -> ``StreamingFbank`` (incremental log-mel) -> ``StreamingEncoder`` (one ``stream_step`` per
chunk, ``usmkit.streaming.step``) -> CTC log-probs -> ``StreamingDecoder`` (partials, endpoints,
optional LAS rescoring). ``StreamingTranscriber`` runs it on samples as they arrive;
``OfflineTranscriber`` (``--no-streaming``) gives the full forward's encoding of the whole input, for
any checkpoint, and decodes it the same way: under chunk-wise attention in windows of whole chunks
(``usmkit.streaming.windowed``: flat memory for hours of audio), under full attention at once (up to
the length whose attention fits ``FULL_ATTENTION_BYTES``; longer inputs are refused with a pointer to
streaming). ``transcribe_whole`` runs it on all samples at once. ``load_model``
loads a checkpoint that can serve it and ``streaming_mask`` picks the chunking a stream runs with;
both raise ``ModelError`` with one line saying what is wrong. ``usmkit.cli.transcribe`` is the command
line on top of this module.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from usmkit.checkpointing.checkpoint import CheckpointError
from usmkit.config import ConfigError, TrainConfig
from usmkit.data.normalize import FeatureStats
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.models.asr import AsrModel
from usmkit.runs import load_trained
from usmkit.streaming.audio import LevelMeter
from usmkit.streaming.decoder import DecoderConfig, Segment, StreamingDecoder
from usmkit.streaming.encoder import StreamingEncoder
from usmkit.streaming.features import FeatureStatsError, StatsNotFoundError, StreamingFbank, checkpoint_feature_stats
from usmkit.streaming.step import NotStreamableError, check_streamable
from usmkit.streaming.windowed import WindowedEncoder


class ModelError(ValueError):
    """A checkpoint that cannot serve this transcription; the message says why and what to do."""


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint ready for transcription: ``model`` (``AsrModel`` in eval mode, with a CTC head), the
    ``TrainConfig`` it was trained with, its tokenizer, the checkpoint path and its feature statistics."""

    model: AsrModel
    cfg: TrainConfig
    tokenizer: Tokenizer
    checkpoint: Path
    stats: FeatureStats


def load_model(checkpoint: str | Path, device: torch.device | str = "cpu", rescore: bool = False) -> LoadedModel:
    """Load ``checkpoint`` (a checkpoint dir, or an experiment dir: its best/latest checkpoint) for
    transcription; ``rescore``: the LAS decoder is needed too. Raises ``ModelError``."""
    try:
        model, cfg, tokenizer, ckpt = load_trained(str(checkpoint), device)
    except (FileNotFoundError, CheckpointError, ConfigError) as e:
        raise ModelError(f"cannot load checkpoint {checkpoint}: {e}") from e
    if tokenizer is None or getattr(model, "ctc", None) is None:
        raise ModelError(
            f"checkpoint {ckpt} ({cfg.task.kind}) has no CTC head; transcription needs a CTC or joint CTC/LAS "
            "model (fine-tune one with recipe=stage3_ctc or stage3_las)"
        )
    if rescore and model.las is None:
        raise ModelError(
            f"--rescore needs an attention (LAS) decoder, but checkpoint {ckpt} is CTC-only; drop --rescore"
        )
    if cfg.data.utterance_mean_norm or cfg.data.speaker_mean_norm:
        which = "utterance_mean_norm" if cfg.data.utterance_mean_norm else "speaker_mean_norm"
        raise ModelError(
            f"checkpoint {ckpt} was trained with data.{which}=true (an utterance's or speaker's own mean "
            "subtracted), which needs the whole audio first; decode it with python -m usmkit.cli.evaluate"
        )
    try:
        stats = checkpoint_feature_stats(ckpt, cfg.data)
    except (StatsNotFoundError, FeatureStatsError) as e:
        raise ModelError(str(e)) from e
    return LoadedModel(model, cfg, tokenizer, ckpt, stats)


def streaming_mask(
    model, chunk_size: int | None = None, left_chunks: int | None = None, checkpoint: str | Path = "the checkpoint"
) -> tuple[int, int, str | None]:
    """(chunk_size, left_chunks, warning or None) a stream of ``model`` runs with; None takes the model's.

    The warning says when the mask differs from the trained one (an approximation). Raises
    ``ModelError`` when the model cannot stream.
    """
    enc_cfg = model.encoder.cfg
    try:
        C, K = check_streamable(enc_cfg, chunk_size, left_chunks)
    except NotStreamableError as e:
        if enc_cfg.causal_conv:
            hint = "pass --chunk-size N / --left-chunks K to stream it anyway (an approximation), or decode whole "
        else:
            hint = "train with model.causal_conv=true for streaming, or decode whole "
        raise ModelError(
            f"checkpoint {checkpoint} cannot stream: {e}. To transcribe, {hint}inputs with --no-streaming"
        ) from e
    warning = None
    if enc_cfg.chunk_size is None or enc_cfg.left_chunks == -1 or (C, K) != (enc_cfg.chunk_size, enc_cfg.left_chunks):
        warning = (
            f"streaming with chunk_size={C}, left_chunks={K} but the model was trained with "
            f"chunk_size={enc_cfg.chunk_size}, left_chunks={enc_cfg.left_chunks}: an approximation, expect more errors"
        )
    return C, K, warning


@dataclass
class RunStats:
    """Timing of one transcription. ``latencies_s``: processing time per encoder chunk, from the audio
    that completes it arriving to its partial result (a call that completes k chunks counts k x its time / k)."""

    audio_s: float = 0.0
    compute_s: float = 0.0
    setup_s: float = 0.0  # before the first chunk (tracing / compiling the encoder step); not in compute_s
    latencies_s: list[float] = field(default_factory=list)

    @property
    def rtf(self) -> float:
        return self.compute_s / self.audio_s if self.audio_s > 0 else float("nan")

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1000.0 if self.latencies_s else float("nan")


class FrameDecoder:
    """Encoder frames -> CTC log-probs -> ``StreamingDecoder``, each frame flagged silent from its 40 ms of audio.

    ``audio(samples)`` must see the samples before ``decode`` gets the frames computed from them (the
    encoder lags the audio, so this holds by construction). ``silence_db``: frames quieter than this
    (dBFS) are silence for the endpointer.
    """

    def __init__(
        self, model, tokenizer, decoder_cfg: DecoderConfig, frame_samples: int, silence_db: float, words=None
    ) -> None:
        self.model = model
        self.decoder = StreamingDecoder(tokenizer, decoder_cfg, las=model.las, words=words)
        self.meter = LevelMeter(frame_samples)
        self.silence_db = silence_db
        self._levels = np.zeros(0)  # dBFS of encoder frames [decoder.frames, decoder.frames + len)

    def audio(self, samples: np.ndarray) -> None:
        self._levels = np.concatenate([self._levels, self.meter.accept(samples)])

    def audio_end(self) -> None:
        self._levels = np.concatenate([self._levels, self.meter.flush()])

    def decode(self, enc: torch.Tensor, log_probs: torch.Tensor | None = None) -> list[Segment]:
        """enc (n, D), the next n encoder frames -> the segments they finalize. ``log_probs`` (n, V): their CTC
        log-probs, if the caller computed them (for many streams at once); else the CTC head runs here."""
        n = enc.shape[0]
        if n == 0:
            return []
        if log_probs is None:
            with torch.no_grad():
                log_probs = self.model.ctc(enc[None])[0]  # (n, V)
        elif log_probs.shape[0] != n:
            raise ValueError(f"log_probs must be ({n}, V) for the {n} encoder frames, got {tuple(log_probs.shape)}")
        levels, self._levels = self._levels[:n], self._levels[n:]
        levels = np.concatenate([levels, np.zeros(n - levels.size)])  # a level not known yet counts as audio
        return self.decoder.accept(log_probs, enc, torch.from_numpy(levels < self.silence_db))

    def finish(self) -> list[Segment]:
        return self.decoder.finish()

    @property
    def partial(self) -> str:
        return self.decoder.partial


class StreamingTranscriber:
    """Samples in (mono float32 at the feature sample rate), segments out; one encoder ``stream_step`` per chunk.

    ``model``: an ``AsrModel`` with a CTC head (and a LAS decoder for rescoring), in eval mode.
    ``chunk_size`` / ``left_chunks``: None = the model's (see ``usmkit.streaming.step.check_streamable``).
    ``step``: how the encoder runs a chunk (``StreamingEncoder``); ``None`` for a caller that runs the
    chunks of many streams itself (``usmkit.serve``): it calls ``feed`` / ``feed_end``, takes the chunks
    from ``encoder`` (``next_chunk`` / ``last_chunk`` -> step -> ``advance``) and decodes their frames
    with ``frames.decode`` / ``frames.finish``, which is what ``accept`` / ``finish`` do in one go.
    """

    def __init__(
        self,
        model,
        tokenizer,
        fbank: StreamingFbank,
        decoder_cfg: DecoderConfig,
        chunk_size: int | None = None,
        left_chunks: int | None = None,
        silence_db: float = -50.0,
        step: str | None = "eager",
        words=None,
    ) -> None:
        self.device = next(model.parameters()).device
        self.fbank = fbank
        self.encoder = StreamingEncoder(model.encoder, chunk_size, left_chunks, step=step)
        self.frames = FrameDecoder(
            model, tokenizer, decoder_cfg, encoder_frame_samples(fbank, model), silence_db, words=words
        )
        self.stats = RunStats()
        start = time.perf_counter()
        self.encoder.warm_up()  # tracing / compiling happens here, not in the first chunk (none without a step)
        self.stats.setup_s = time.perf_counter() - start

    @property
    def partial(self) -> str:
        return self.frames.partial

    @property
    def meter(self) -> LevelMeter:
        return self.frames.meter

    def feed(self, samples: np.ndarray) -> torch.Tensor:
        """The next samples (N,) -> their feature frames (1, t, F) on the model's device (levels noted for the endpointer)."""
        return self.fbank.frames(self.feed_windows(samples))[None].to(self.device)

    def feed_windows(self, samples: np.ndarray) -> torch.Tensor:
        """``feed`` up to the features: the raw windows (t, L) of the frames the samples complete
        (``fbank.frames`` computes them, for many streams at once on a server)."""
        self.frames.audio(samples)
        self.stats.audio_s += samples.size / self.fbank.cfg.sample_rate
        return self.fbank.accept_windows(samples)

    def feed_end(self) -> torch.Tensor:
        """End of the audio -> the last feature frames (1, t, F)."""
        self.frames.audio_end()
        return self.fbank.flush()[None].to(self.device)

    def accept(self, samples: np.ndarray) -> list[Segment]:
        """The next samples (N,) -> the segments finalized by them."""
        start = time.perf_counter()
        chunks_before = self.encoder.chunks
        enc = self.encoder.accept(self.feed(samples))  # (1, n C, D)
        segments = self.frames.decode(enc[0])
        elapsed = time.perf_counter() - start
        self.stats.compute_s += elapsed
        k = self.encoder.chunks - chunks_before
        if k:
            self.stats.latencies_s += [elapsed / k] * k
        return segments

    def finish(self) -> list[Segment]:
        """End of the audio: the feature and encoder tails, then the open segment."""
        start = time.perf_counter()
        feats = self.feed_end()  # (1, t, F)
        enc = torch.cat([self.encoder.accept(feats), self.encoder.flush()], dim=1)  # (1, n, D)
        segments = self.frames.decode(enc[0]) + self.frames.finish()
        self.stats.compute_s += time.perf_counter() - start
        return segments


# The full forward's attention over T' frames holds a (T', T') mask and, per head, score and weight matrices
# of float32: about (8 H + 1) T'^2 bytes. Inputs under full attention (or unbounded history) are encoded
# at once only up to the length where that stays within this budget.
FULL_ATTENTION_BYTES = 2 << 30


class OfflineTranscriber:
    """``--no-streaming``: samples in as they are read, segments out; the encoder frames are the full
    forward's under ``chunk_size`` / ``left_chunks`` (any checkpoint: causal convolution not needed).

    Chunk-wise attention with ``left_chunks >= 0``: ``WindowedEncoder`` encodes windows of
    ``window_chunks`` whole chunks as the features arrive, in memory that does not grow with the input.
    Full attention (``chunk_size=None``) or ``left_chunks=-1``: the features are kept and encoded at
    ``finish``; ``check_length`` (called as they arrive) raises ``UsageError`` once the input is longer
    than ``max_seconds``. Same interface as ``StreamingTranscriber`` (``accept``, ``finish``, ``stats``).
    """

    def __init__(
        self,
        model,
        tokenizer,
        fbank: StreamingFbank,
        decoder_cfg: DecoderConfig,
        chunk_size: int | None,
        left_chunks: int,
        silence_db: float = -50.0,
        words=None,
        window_chunks: int | None = None,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.fbank = fbank
        self.chunk_size, self.left_chunks = chunk_size, left_chunks
        self.frames = FrameDecoder(
            model, tokenizer, decoder_cfg, encoder_frame_samples(fbank, model), silence_db, words=words
        )
        self.stats = RunStats()
        self.windowed = chunk_size is not None and left_chunks >= 0
        self.encoder = WindowedEncoder(model.encoder, chunk_size, left_chunks, window_chunks) if self.windowed else None
        self._feats: list[torch.Tensor] = []  # (1, t, F) each: the input so far, without windows
        self._frames_held = 0
        enc_cfg = model.encoder.cfg
        self.max_seconds = None
        if not self.windowed:
            max_frames = math.isqrt(FULL_ATTENTION_BYTES // (8 * enc_cfg.num_heads + 1))  # encoder frames
            self.max_seconds = max_frames * encoder_frame_samples(fbank, model) / fbank.cfg.sample_rate

    @property
    def partial(self) -> str:
        return self.frames.partial

    @property
    def meter(self) -> LevelMeter:
        return self.frames.meter

    def check_length(self, seconds: float, describe: str = "the input") -> None:
        """``UsageError`` when ``seconds`` of audio are more than can be encoded at once (full attention)."""
        if self.max_seconds is None or seconds <= self.max_seconds:
            return
        raise UsageError(
            f"{describe}: {seconds:.0f} s of audio is too long to encode at once under full attention "
            f"(chunk_size={self.chunk_size}, left_chunks={self.left_chunks}), whose memory grows with the square "
            f"of the length: at most {self.max_seconds:.0f} s. Transcribe it streaming (drop --no-streaming; "
            "needs a model trained with causal_conv=true), pass --chunk-size N --left-chunks K to encode it in "
            "chunks (an approximation for this model), or split the file"
        )

    def _encode(self, feats: torch.Tensor) -> list[Segment]:
        """The next feature frames (1, t, F) -> the segments their encoder frames finalize."""
        if self.windowed:
            return self.frames.decode(self.encoder.accept(feats)[0])
        self._feats.append(feats)
        self._frames_held += feats.shape[1]
        self.check_length(self._frames_held * self.fbank.shift / self.fbank.cfg.sample_rate)
        return []

    def accept(self, samples: np.ndarray) -> list[Segment]:
        """The next samples (N,) -> the segments finalized by them."""
        start = time.perf_counter()
        self.frames.audio(samples)
        self.stats.audio_s += samples.size / self.fbank.cfg.sample_rate
        segments = self._encode(self.fbank.accept(samples)[None].to(self.device))
        self.stats.compute_s += time.perf_counter() - start
        return segments

    def finish(self) -> list[Segment]:
        """End of the audio: the last frames, then the open segment."""
        start = time.perf_counter()
        self.frames.audio_end()
        segments = self._encode(self.fbank.flush()[None].to(self.device))
        if self.windowed:
            enc = self.encoder.flush()  # (1, r, D)
        else:
            feats = torch.cat(self._feats, dim=1)  # (1, T, F)
            self._feats = []
            enc = feats.new_zeros(1, 0, self.model.encoder.cfg.d_model)
            if feats.shape[1] >= self.model.encoder.subsampling.receptive_field:
                with torch.no_grad():
                    lengths = torch.tensor([feats.shape[1]], device=self.device)
                    enc, _ = self.model.encoder(feats, lengths, self.chunk_size, self.left_chunks)  # (1, T', D)
        segments += self.frames.decode(enc[0]) + self.frames.finish()
        self.stats.compute_s += time.perf_counter() - start
        return segments


def transcribe_whole(
    model,
    tokenizer,
    fbank: StreamingFbank,
    decoder_cfg: DecoderConfig,
    samples: np.ndarray,
    chunk_size: int | None,
    left_chunks: int,
    silence_db: float = -50.0,
    words=None,
    window_chunks: int | None = None,
) -> tuple[list[Segment], RunStats, LevelMeter]:
    """Non-streaming: all samples (N,) through an ``OfflineTranscriber`` (the full forward's encoding under
    the given mask), segmented and decoded with the same decoder (endpoints, rescoring) as the stream."""
    transcriber = OfflineTranscriber(
        model, tokenizer, fbank, decoder_cfg, chunk_size, left_chunks, silence_db, words, window_chunks
    )
    segments = transcriber.accept(samples) + transcriber.finish()
    return segments, transcriber.stats, transcriber.meter


def encoder_frame_samples(fbank: StreamingFbank, model) -> int:
    """Audio samples per encoder frame of ``model``: 640 = 40 ms at 16 kHz and 4x subsampling."""
    return model.encoder.subsampling_factor * fbank.shift
