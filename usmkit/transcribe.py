"""``usmkit-transcribe``: streaming speech recognition of a file, raw PCM on stdin, or the microphone.

    usmkit-transcribe talk.flac --checkpoint exp/stage3_ctc --decode ctc_beam --json talk.json
    arecord -f S16_LE -r 16000 -c 1 -t raw | usmkit-transcribe - --checkpoint exp/stage3_ctc
    usmkit-transcribe --mic --checkpoint exp/stage3_ctc

Audio goes through the same path a live stream takes, block by block: incremental log-mel features
(``usmkit.streaming.features``) -> one encoder ``stream_step`` per chunk (``usmkit.models.streaming``)
-> CTC log-probs -> the streaming decoder (partials, endpoints, optional rescoring;
``usmkit.streaming.decoder``). Partial results are shown live on one rewritten line when stdout is a
terminal (plain ``partial:`` lines otherwise); finals as ``[00:01.20 - 00:03.48] text``. At the end
the real-time factor and the per-chunk latency go to stderr.

Exit status: 0 done (also when there was no speech), 2 bad input or usage (the message says which),
1 a failure at run time. Errors are one line on stderr, never a traceback (``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from usmkit.models.streaming import NotStreamableError, StreamingEncoder, check_streamable
from usmkit.models.subsampling import RECEPTIVE_FIELD, SUBSAMPLING_FACTOR
from usmkit.streaming.audio import AudioError, AudioSource, FileSource, LevelMeter, MicrophoneSource, RawPcmSource
from usmkit.streaming.decoder import DecoderConfig, EndpointConfig, Segment, StreamingDecoder
from usmkit.streaming.features import StatsNotFoundError, StreamingFbank, checkpoint_feature_stats

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
CLIP_WARN_FRACTION = 0.001  # warn when more than 0.1% of the samples sit at full scale


class UsageError(Exception):
    """Bad command line, checkpoint or input: exit status 2."""


# ---------------------------------------------------------------------------------------------- pipeline
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

    def __init__(self, model, tokenizer, decoder_cfg: DecoderConfig, frame_samples: int, silence_db: float) -> None:
        self.model = model
        self.decoder = StreamingDecoder(tokenizer, decoder_cfg, las=model.las)
        self.meter = LevelMeter(frame_samples)
        self.silence_db = silence_db
        self._levels = np.zeros(0)  # dBFS of encoder frames [decoder.frames, decoder.frames + len)

    def audio(self, samples: np.ndarray) -> None:
        self._levels = np.concatenate([self._levels, self.meter.accept(samples)])

    def audio_end(self) -> None:
        self._levels = np.concatenate([self._levels, self.meter.flush()])

    def decode(self, enc: torch.Tensor) -> list[Segment]:
        """enc (n, D), the next n encoder frames -> the segments they finalize."""
        n = enc.shape[0]
        if n == 0:
            return []
        with torch.no_grad():
            log_probs = self.model.ctc(enc[None])[0]  # (n, V)
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
    ``chunk_size`` / ``left_chunks``: None = the model's (see ``usmkit.models.streaming.check_streamable``).
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
        step: str = "eager",
    ) -> None:
        self.device = next(model.parameters()).device
        self.fbank = fbank
        self.encoder = StreamingEncoder(model.encoder, chunk_size, left_chunks, step=step)
        self.frames = FrameDecoder(model, tokenizer, decoder_cfg, _encoder_frame_samples(fbank), silence_db)
        self.stats = RunStats()
        start = time.perf_counter()
        self.encoder.warm_up()  # tracing / compiling happens here, not in the first chunk
        self.stats.setup_s = time.perf_counter() - start

    @property
    def partial(self) -> str:
        return self.frames.partial

    @property
    def meter(self) -> LevelMeter:
        return self.frames.meter

    def accept(self, samples: np.ndarray) -> list[Segment]:
        """The next samples (N,) -> the segments finalized by them."""
        start = time.perf_counter()
        chunks_before = self.encoder.chunks
        self.frames.audio(samples)
        feats = self.fbank.accept(samples)  # (t, F)
        enc = self.encoder.accept(feats[None].to(self.device))  # (1, n C, D)
        segments = self.frames.decode(enc[0])
        elapsed = time.perf_counter() - start
        self.stats.audio_s += samples.size / self.fbank.cfg.sample_rate
        self.stats.compute_s += elapsed
        k = self.encoder.chunks - chunks_before
        if k:
            self.stats.latencies_s += [elapsed / k] * k
        return segments

    def finish(self) -> list[Segment]:
        """End of the audio: the feature and encoder tails, then the open segment."""
        start = time.perf_counter()
        self.frames.audio_end()
        feats = self.fbank.flush()[None].to(self.device)  # (1, t, F)
        enc = torch.cat([self.encoder.accept(feats), self.encoder.flush()], dim=1)  # (1, n, D)
        segments = self.frames.decode(enc[0]) + self.frames.finish()
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
) -> tuple[list[Segment], RunStats, LevelMeter]:
    """Non-streaming: encode all samples (N,) at once under the given mask, then segment and decode them
    with the same decoder (endpoints, rescoring) as the stream."""
    start = time.perf_counter()
    frames = FrameDecoder(model, tokenizer, decoder_cfg, _encoder_frame_samples(fbank), silence_db)
    frames.audio(samples)
    frames.audio_end()
    device = next(model.parameters()).device
    feats = torch.cat([fbank.accept(samples), fbank.flush()])[None].to(device)  # (1, T, F)
    segments: list[Segment] = []
    if feats.shape[1] >= RECEPTIVE_FIELD:
        with torch.no_grad():
            lengths = torch.tensor([feats.shape[1]], device=device)
            enc, _ = model.encoder(feats, lengths, chunk_size=chunk_size, left_chunks=left_chunks)  # (1, T', D)
        segments = frames.decode(enc[0]) + frames.finish()
    stats = RunStats(audio_s=samples.size / fbank.cfg.sample_rate, compute_s=time.perf_counter() - start)
    return segments, stats, frames.meter


def _encoder_frame_samples(fbank: StreamingFbank) -> int:
    return SUBSAMPLING_FACTOR * fbank.shift  # 640 samples = 40 ms at 16 kHz


# ---------------------------------------------------------------------------------------------- output
def format_time(seconds: float) -> str:
    """``83.456`` -> ``01:23.46``; ``h:mm:ss.ss`` from an hour on."""
    minutes, secs = divmod(max(seconds, 0.0), 60.0)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{secs:05.2f}" if hours else f"{minutes:02d}:{secs:05.2f}"


class Printer:
    """Finals as lines; partials on one rewritten line on a terminal, as ``partial:`` lines otherwise."""

    def __init__(self, out: TextIO, partials: bool) -> None:
        self.out = out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.partials = partials
        self._shown = ""

    def partial(self, text: str) -> None:
        if not self.partials or text == self._shown:
            return
        self._shown = text
        if self.tty:
            width = shutil.get_terminal_size((80, 20)).columns - 1
            self.out.write("\r\x1b[K" + text[-width:])
        elif text:
            self.out.write(f"partial: {text}\n")
        self.out.flush()

    def close(self) -> None:
        """End the rewritten partial line (a terminal keeps what was last shown on it)."""
        if self.tty and self._shown:
            self.out.write("\n")
            self.out.flush()
        self._shown = ""

    def final(self, segment: Segment) -> None:
        if self.tty and self._shown:
            self.out.write("\r\x1b[K")
        self._shown = ""
        self.out.write(f"[{format_time(segment.start)} - {format_time(segment.end)}] {segment.text}\n")
        self.out.flush()


# ---------------------------------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would sys.exit(2) with the usage; keep main() in charge
        raise UsageError(f"{message} (see usmkit-transcribe --help)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="usmkit-transcribe",
        description="Streaming speech recognition with a usmkit checkpoint (causal conv, chunk-wise attention).",
    )
    p.add_argument("audio", nargs="?", help="audio file (wav/flac/ogg/mp3, any rate), or - for raw 16-bit PCM on stdin")
    p.add_argument(
        "--mic", action="store_true", help="record from the default microphone (needs usmkit[mic]); Ctrl-C stops"
    )
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint dir, or an experiment dir (its best/latest checkpoint)"
    )
    p.add_argument(
        "--chunk-size", type=_positive_int, help="encoder frames per chunk (40 ms each); default: the model's"
    )
    p.add_argument("--left-chunks", type=_nonnegative_int, help="chunks of attention history; default: the model's")
    p.add_argument("--decode", choices=("ctc_greedy", "ctc_beam"), help="default ctc_greedy (ctc_beam with --rescore)")
    p.add_argument("--beam-size", type=_positive_int, default=8)
    p.add_argument("--rescore", action="store_true", help="rescore each segment's n-best with the LAS decoder")
    p.add_argument("--rescore-ctc-weight", type=float, default=0.3)
    p.add_argument("--json", type=Path, help="write the segments with word timings to this JSON file")
    p.add_argument("--sample-rate", type=_positive_int, default=16000, help="sample rate of raw PCM on stdin")
    p.add_argument("--no-streaming", action="store_true", help="encode the whole input at once (any checkpoint)")
    p.add_argument("--endpoint-blank", type=float, default=0.8, help="seconds of trailing blank that end a segment")
    p.add_argument("--endpoint-silence", type=float, default=0.5, help="seconds of trailing silence that end a segment")
    p.add_argument("--max-segment", type=float, default=20.0, help="longest segment in seconds")
    p.add_argument("--silence-db", type=float, default=-50.0, help="audio below this level (dBFS) is silence")
    p.add_argument("--no-partials", action="store_true", help="print final segments only")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--threads", type=_positive_int, help="CPU threads for torch (default: torch's choice)")
    p.add_argument(
        "--step",
        choices=("jit", "eager", "compile"),
        default="jit",
        help="how the encoder runs each chunk: jit = traced TorchScript graph (default; same output, "
        "no Python overhead per op, a few seconds to trace), eager = plain PyTorch, "
        "compile = torch.compile (minutes to compile on a CPU)",
    )
    p.add_argument(
        "--quantize",
        choices=("none", "int8"),
        default="none",
        help="int8: int8 weights for every linear layer (CPU only; faster, slightly less exact)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name!r} is not a device ({e}); use cpu, cuda or auto") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available here; use --device cpu")
    return device


def _open_source(args, sample_rate: int, block_seconds: float) -> AudioSource:
    if args.mic:
        if args.audio:
            raise UsageError(f"give either an audio input ({args.audio}) or --mic, not both")
        return MicrophoneSource(sample_rate, block_seconds)
    if not args.audio:
        raise UsageError("no input: pass an audio file, - for raw 16-bit PCM on stdin, or --mic")
    if args.audio == "-":
        return RawPcmSource(sys.stdin.buffer, args.sample_rate, sample_rate, block_seconds)
    return FileSource(args.audio, sample_rate, block_seconds)


def _load(args, device: torch.device):
    """(model, train config, tokenizer, checkpoint path, feature stats), or UsageError saying what is wrong."""
    from usmkit.checkpoint import CheckpointError
    from usmkit.config import ConfigError
    from usmkit.tasks import load_trained

    try:
        model, cfg, tokenizer, ckpt = load_trained(args.checkpoint, device)
    except (FileNotFoundError, CheckpointError, ConfigError) as e:
        raise UsageError(f"cannot load checkpoint {args.checkpoint}: {e}") from e
    if tokenizer is None or getattr(model, "ctc", None) is None:
        raise UsageError(
            f"checkpoint {ckpt} ({cfg.task.kind}) has no CTC head; transcription needs a CTC or joint CTC/LAS "
            "model (fine-tune one with recipe=stage3_ctc or stage3_las)"
        )
    if args.rescore and model.las is None:
        raise UsageError(
            f"--rescore needs an attention (LAS) decoder, but checkpoint {ckpt} is CTC-only; drop --rescore"
        )
    if cfg.data.utterance_mean_norm or cfg.data.speaker_mean_norm:
        which = "utterance_mean_norm" if cfg.data.utterance_mean_norm else "speaker_mean_norm"
        raise UsageError(
            f"checkpoint {ckpt} was trained with data.{which}=true (an utterance's or speaker's own mean "
            "subtracted), which needs the whole audio first; decode it with python -m usmkit.evaluate"
        )
    try:
        stats = checkpoint_feature_stats(ckpt, cfg.data)
    except StatsNotFoundError as e:
        raise UsageError(str(e)) from e
    return model, cfg, tokenizer, ckpt, stats


def _streaming_mask(args, model, ckpt: Path, warn: TextIO) -> tuple[int, int]:
    enc_cfg = model.encoder.cfg
    try:
        C, K = check_streamable(enc_cfg, args.chunk_size, args.left_chunks)
    except NotStreamableError as e:
        if enc_cfg.causal_conv:
            hint = "pass --chunk-size N / --left-chunks K to stream it anyway (an approximation), or decode whole "
        else:
            hint = "train with model.causal_conv=true for streaming, or decode whole "
        raise UsageError(
            f"checkpoint {ckpt} cannot stream: {e}. To transcribe, {hint}inputs with --no-streaming"
        ) from e
    if enc_cfg.chunk_size is None or enc_cfg.left_chunks == -1 or (C, K) != (enc_cfg.chunk_size, enc_cfg.left_chunks):
        print(
            f"warning: streaming with chunk_size={C}, left_chunks={K} but the model was trained with "
            f"chunk_size={enc_cfg.chunk_size}, left_chunks={enc_cfg.left_chunks}: an approximation, expect more errors",
            file=warn,
        )
    return C, K


def _decoder_config(args) -> DecoderConfig:
    mode = args.decode or ("ctc_beam" if args.rescore else "ctc_greedy")
    if args.rescore and mode != "ctc_beam":
        raise UsageError("--rescore ranks the n-best of a beam search: use it with --decode ctc_beam")
    try:
        return DecoderConfig(
            mode=mode,
            beam_size=args.beam_size,
            rescore=args.rescore,
            rescore_ctc_weight=args.rescore_ctc_weight,
            endpoint=EndpointConfig(
                trailing_blank_s=args.endpoint_blank,
                trailing_silence_s=args.endpoint_silence,
                max_segment_s=args.max_segment,
            ),
        )
    except ValueError as e:
        raise UsageError(str(e)) from e


def _clipping_warning(meter: LevelMeter, source: AudioSource, err: TextIO) -> bool:
    """Warn when the audio so far (at least 0.5 s of it) is clipped; returns whether it warned."""
    if meter.samples < 8000 or meter.clipped_fraction <= CLIP_WARN_FRACTION:
        return False
    print(
        f"warning: {source.describe}: {100 * meter.clipped_fraction:.1f}% of the samples are clipped (at full "
        "scale); transcribing anyway, expect more errors (lower the recording gain)",
        file=err,
    )
    return True


def _run_streaming(transcriber: StreamingTranscriber, source: AudioSource, printer: Printer, err: TextIO):
    """Feed the source through the transcriber; returns (segments, interrupted by Ctrl-C)."""
    segments: list[Segment] = []
    warned, interrupted = False, False
    try:
        for block in source:
            for seg in transcriber.accept(block):
                printer.final(seg)
                segments.append(seg)
            printer.partial(transcriber.partial)
            warned = warned or _clipping_warning(transcriber.meter, source, err)
    except KeyboardInterrupt:
        interrupted = True
    except AudioError as e:  # decoding failed part way: what came before is decoded, shown and saved first
        source.failure = e
    for seg in transcriber.finish():
        printer.final(seg)
        segments.append(seg)
    if not warned:
        _clipping_warning(transcriber.meter, source, err)
    return segments, transcriber.stats, interrupted


def _run_whole(args, model, tokenizer, fbank, decoder_cfg, source, printer, err, mask: tuple[int | None, int]):
    """--no-streaming: read all of the input, then encode and decode it at once."""
    interrupted = False
    blocks: list[np.ndarray] = []
    try:
        for block in source:
            blocks.append(block)
    except KeyboardInterrupt:
        interrupted = True
    except AudioError as e:  # decoding failed part way: the audio before it is transcribed first
        source.failure = e
    samples = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)
    segments, stats, meter = transcribe_whole(model, tokenizer, fbank, decoder_cfg, samples, *mask, args.silence_db)
    for seg in segments:
        printer.final(seg)
    _clipping_warning(meter, source, err)
    return segments, stats, interrupted


def run(args, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The command with parsed arguments; raises UsageError / AudioError for bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    device = _device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    decoder_cfg = _decoder_config(args)
    model, cfg, tokenizer, ckpt, stats = _load(args, device)
    if args.quantize == "int8":
        if device.type != "cpu":
            raise UsageError(f"--quantize int8 runs on the CPU only; drop it or use --device cpu (got {device})")
        from usmkit.streaming.quantize import quantize_linear_int8

        model = quantize_linear_int8(model)
    feature_cfg = cfg.data.features
    enc_cfg = model.encoder.cfg
    streaming = not args.no_streaming
    if streaming:
        C, K = _streaming_mask(args, model, ckpt, err)
    else:
        C = enc_cfg.chunk_size if args.chunk_size is None else args.chunk_size
        K = enc_cfg.left_chunks if args.left_chunks is None else args.left_chunks
    # Blocks of one chunk of audio, so that each block completes about one encoder chunk.
    block_s = (C or 4) * SUBSAMPLING_FACTOR * feature_cfg.frame_shift_ms / 1000.0
    source = _open_source(args, feature_cfg.sample_rate, block_s)
    fbank = StreamingFbank(feature_cfg, stats)
    printer = Printer(out, partials=not args.no_partials)
    if streaming:
        transcriber = StreamingTranscriber(
            model, tokenizer, fbank, decoder_cfg, C, K, silence_db=args.silence_db, step=args.step
        )
        segments, run_stats, interrupted = _run_streaming(transcriber, source, printer, err)
    else:
        segments, run_stats, interrupted = _run_whole(
            args, model, tokenizer, fbank, decoder_cfg, source, printer, err, (C, K)
        )
    printer.close()
    failure = getattr(source, "failure", None)
    for note in source.notes():
        print(f"note: {note}", file=err)
    if run_stats.audio_s == 0 and failure is None:
        raise AudioError(f"{source.describe}: no audio samples arrived; nothing to transcribe")
    if not segments:
        print(f"no speech detected in {source.describe} ({run_stats.audio_s:.2f} s of audio)", file=err)
    if streaming:
        summary = (
            f"RTF {run_stats.rtf:.3f}, chunk latency p50 {run_stats.latency_ms(50):.0f} ms, "
            f"p95 {run_stats.latency_ms(95):.0f} ms, {len(run_stats.latencies_s)} chunks, "
            f"{run_stats.audio_s:.2f} s of audio"
        )
    else:
        summary = f"RTF {run_stats.rtf:.3f} (whole input at once, no streaming), {run_stats.audio_s:.2f} s of audio"
    print(summary, file=err)
    if args.json is not None:
        _write_json(args.json, source, ckpt, decoder_cfg, C, K, streaming, run_stats, segments, failure)
    if failure is not None:
        print(f"the transcript above covers the audio before the failure ({run_stats.audio_s:.2f} s)", file=err)
        raise failure
    if interrupted and not args.mic:
        print("interrupted: the transcript above covers the audio read so far", file=err)
        return 130
    return EXIT_OK


def _write_json(
    path: Path, source, ckpt, decoder_cfg, C, K, streaming: bool, s: RunStats, segments, failure=None
) -> None:
    record = {
        "input": source.describe,
        "checkpoint": str(ckpt),
        "streaming": streaming,
        "chunk_size": C,
        "left_chunks": K,
        "decode": decoder_cfg.mode,
        "rescore": decoder_cfg.rescore,
        "audio_seconds": round(s.audio_s, 3),
        "rtf": round(s.rtf, 5),
        "setup_seconds": round(s.setup_s, 3),
        "chunk_latency_ms": {"p50": s.latency_ms(50), "p95": s.latency_ms(95)} if s.latencies_s else None,
        "chunks": len(s.latencies_s),
        "segments": [seg.as_dict() for seg in segments],
        **({"error": str(failure)} if failure is not None else {}),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    except OSError as e:
        raise RuntimeError(f"cannot write --json {path}: {e}") from e


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 2 bad input/usage, 1 failure)."""
    parser = build_parser()
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        return run(args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except KeyboardInterrupt:  # before the audio loop, which handles Ctrl-C itself
        print("usmkit-transcribe: interrupted", file=sys.stderr)
        return 130
    except (UsageError, AudioError) as e:
        if debug:
            traceback.print_exc()
        print(f"usmkit-transcribe: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - the one place that turns any failure into a message and a status
        if debug:
            traceback.print_exc()
        print(
            f"usmkit-transcribe: error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
