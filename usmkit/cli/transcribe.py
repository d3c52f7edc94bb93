"""``usmkit-transcribe``: streaming speech recognition of a file, raw PCM on stdin, or the microphone.

    usmkit-transcribe talk.flac --checkpoint exp/stage3_ctc --decode ctc_beam --json talk.json
    arecord -f S16_LE -r 16000 -c 1 -t raw | usmkit-transcribe - --checkpoint exp/stage3_ctc
    usmkit-transcribe --mic --checkpoint exp/stage3_ctc
    usmkit-transcribe talk.flac --engine onnx --model exp/stage3_ctc/export_onnx   # python -m usmkit.cli.export
    usmkit-transcribe talk.flac --engine onnx --model exp/stage3_ctc/export_onnx --lexicon  # its bundled lexicon

Audio goes through the same path a live stream takes, block by block (``usmkit.streaming.pipeline``):
incremental log-mel features -> one encoder ``stream_step`` per chunk -> CTC log-probs -> the
streaming decoder (partials, endpoints, optional rescoring). This module is the command line on it:
arguments, audio source, printing. Partial results are shown live on one rewritten line when stdout
is a terminal (plain ``partial:`` lines otherwise); finals as ``[00:01.20 - 00:03.48] text``. At the
end the real-time factor and the per-chunk latency go to stderr.

``--no-streaming`` encodes the whole input as the full forward does (any checkpoint), under chunk-wise
attention window by window in flat memory (``usmkit.streaming.windowed``); under full attention it is
refused for inputs too long to encode at once.

Exit status: 0 done (also when there was no speech), 2 bad input or usage (the message says which),
1 a failure at run time. Errors are one line on stderr, never a traceback (``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import TextIO

import torch

from usmkit.checkpointing.atomic import write_result_file
from usmkit.checkpointing.output_dir import check_output_file
from usmkit.cli.args import (
    UsageParser,
    add_lexicon_options,
    add_model_options,
    add_stream_options,
    check_model_choice,
    decoder_config,
    device_arg,
    lexicon_decoder,
    load_exported,
    positive_int,
)
from usmkit.errors import UsageError, debug_enabled  # UsageError: bad command line, checkpoint or input (exit 2)
from usmkit.streaming.audio import AudioError, AudioSource, FileSource, LevelMeter, MicrophoneSource, RawPcmSource
from usmkit.streaming.decoder import Segment
from usmkit.streaming.features import StreamingFbank
from usmkit.streaming.pipeline import (
    ModelError,
    OfflineTranscriber,
    RunStats,
    StreamingTranscriber,
    load_model,
    streaming_mask,
)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
JSON_KEYS = ("input", "checkpoint", "segments")  # what every --json file this command writes holds
CLIP_WARN_FRACTION = 0.001  # warn when more than 0.1% of the samples sit at full scale


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
def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="usmkit-transcribe",
        description="Streaming speech recognition with a usmkit checkpoint (causal conv, chunk-wise attention).",
    )
    p.add_argument("audio", nargs="?", help="audio file (wav/flac/ogg/mp3, any rate), or - for raw 16-bit PCM on stdin")
    p.add_argument(
        "--mic", action="store_true", help="record from the default microphone (needs usmkit[mic]); Ctrl-C stops"
    )
    add_model_options(p)
    add_stream_options(p)
    add_lexicon_options(p)
    p.add_argument("--json", type=Path, help="write the segments with word timings to this JSON file")
    p.add_argument("--sample-rate", type=positive_int, default=16000, help="sample rate of raw PCM on stdin")
    p.add_argument("--no-streaming", action="store_true", help="encode the whole input at once (any checkpoint)")
    p.add_argument("--no-partials", action="store_true", help="print final segments only")
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
    """(model, feature config, tokenizer, checkpoint path, feature stats, step, lexicon decoder or None), or
    UsageError saying what is wrong."""
    check_model_choice(args)
    if args.engine != "torch":
        loaded = load_exported(args, device)
        words = lexicon_decoder(args, loaded)
        return loaded.model, loaded.features, loaded.tokenizer, loaded.path, loaded.stats, loaded.step, words
    try:
        loaded = load_model(args.checkpoint, device, rescore=args.rescore)
    except ModelError as e:
        raise UsageError(str(e)) from e
    words = lexicon_decoder(args, loaded)
    return loaded.model, loaded.cfg.data.features, loaded.tokenizer, loaded.checkpoint, loaded.stats, args.step, words


def _streaming_mask(args, model, ckpt: Path, warn: TextIO) -> tuple[int, int]:
    try:
        C, K, warning = streaming_mask(model, args.chunk_size, args.left_chunks, ckpt)
    except ModelError as e:
        raise UsageError(str(e)) from e
    if warning:
        print(f"warning: {warning}", file=warn)
    return C, K


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


def _run_streaming(
    transcriber: StreamingTranscriber | OfflineTranscriber, source: AudioSource, printer: Printer, err: TextIO
):
    """Feed the source through the transcriber; returns (segments, run stats, interrupted by Ctrl-C)."""
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


def _offline_transcriber(args, model, tokenizer, fbank, decoder_cfg, source, mask: tuple[int | None, int], words=None):
    """--no-streaming: the full forward's encoding of the whole input (``OfflineTranscriber``); a file too
    long to encode at once (full attention only) is refused before it is read."""
    transcriber = OfflineTranscriber(model, tokenizer, fbank, decoder_cfg, *mask, args.silence_db, words=words)
    if isinstance(source, FileSource):
        transcriber.check_length(source.declared_frames / source.info.samplerate, source.describe)
    return transcriber


def run(args, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The command with parsed arguments; raises UsageError / AudioError for bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.json is not None:  # before any work: never over a file that is not an earlier transcript
        check_output_file(
            args.json, option="--json", own_words="an earlier transcript", own_keys=JSON_KEYS,
            home=[Path(m) for m in (args.checkpoint, args.model) if m],
        )  # fmt: skip
    device = device_arg(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    decoder_cfg = decoder_config(args)
    model, feature_cfg, tokenizer, ckpt, stats, step, words = _load(args, device)
    if args.quantize == "int8":
        if device.type != "cpu":
            raise UsageError(f"--quantize int8 runs on the CPU only; drop it or use --device cpu (got {device})")
        from usmkit.streaming.quantize import quantize_linear_int8

        model = quantize_linear_int8(model)
    enc_cfg = model.encoder.cfg
    frame_s = model.encoder.subsampling_factor * feature_cfg.frame_shift_ms / 1000.0  # one encoder frame
    decoder_cfg = replace(decoder_cfg, endpoint=replace(decoder_cfg.endpoint, frame_s=frame_s))
    streaming = not args.no_streaming
    if streaming:
        C, K = _streaming_mask(args, model, ckpt, err)
    else:
        C = enc_cfg.chunk_size if args.chunk_size is None else args.chunk_size
        K = enc_cfg.left_chunks if args.left_chunks is None else args.left_chunks
    # Blocks of one chunk of audio, so that each block completes about one encoder chunk.
    block_s = (C or 4) * frame_s
    source = _open_source(args, feature_cfg.sample_rate, block_s)
    fbank = StreamingFbank(feature_cfg, stats)
    printer = Printer(out, partials=streaming and not args.no_partials)  # offline: finals only, as they are ready
    if streaming:
        transcriber = StreamingTranscriber(
            model,
            tokenizer,
            fbank,
            decoder_cfg,
            C,
            K,
            silence_db=args.silence_db,
            step=step,
            words=words,
        )
    else:
        transcriber = _offline_transcriber(args, model, tokenizer, fbank, decoder_cfg, source, (C, K), words)
    segments, run_stats, interrupted = _run_streaming(transcriber, source, printer, err)
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
        lexicon = asdict(words.cfg) if words is not None else None
        _write_json(args.json, source, ckpt, decoder_cfg, C, K, streaming, run_stats, segments, failure, lexicon)
    if failure is not None:
        print(f"the transcript above covers the audio before the failure ({run_stats.audio_s:.2f} s)", file=err)
        raise failure
    if interrupted and not args.mic:
        print("interrupted: the transcript above covers the audio read so far", file=err)
        return 130
    return EXIT_OK


def _write_json(
    path: Path, source, ckpt, decoder_cfg, C, K, streaming: bool, s: RunStats, segments, failure=None, lexicon=None
) -> None:
    record = {
        "input": source.describe,
        "checkpoint": str(ckpt),
        "streaming": streaming,
        "chunk_size": C,
        "left_chunks": K,
        "decode": decoder_cfg.mode,
        "rescore": decoder_cfg.rescore,
        "lexicon": lexicon,  # the lexicon finals' settings (LexiconConfig), or None
        "audio_seconds": round(s.audio_s, 3),
        "rtf": round(s.rtf, 5),
        "setup_seconds": round(s.setup_s, 3),
        "chunk_latency_ms": {"p50": s.latency_ms(50), "p95": s.latency_ms(95)} if s.latencies_s else None,
        "chunks": len(s.latencies_s),
        "segments": [seg.as_dict() for seg in segments],
        **({"error": str(failure)} if failure is not None else {}),
    }
    write_result_file(path, json.dumps(record, indent=2) + "\n", what="--json")


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 2 bad input/usage, 1 failure)."""
    parser = build_parser()
    debug = "--debug" in (sys.argv[1:] if argv is None else argv) or debug_enabled()  # or USMKIT_DEBUG=1
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
        return e.exit_code  # 2, or 1 for a failure of the machine (a full disk)
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
