"""argparse pieces shared by the console scripts (usmkit-transcribe, usmkit-serve, usmkit-average).

``add_stream_options`` defines the options of a streaming recognizer, and ``decoder_config`` and
``device_arg`` read them, the same way for every command: chunking, decoding, endpointing, device.
``add_model_options`` / ``load_exported`` and ``add_lexicon_options`` / ``lexicon_decoder`` do the same
for what runs the model (a checkpoint in PyTorch, or an export under onnxruntime / AOTInductor) and for
lexicon finals (the training transcripts' words and word LM, from the checkpoint's manifests or
bundled in the export).

A bad argument raises ``UsageError`` (one line, exit code 2, through ``usmkit.errors.user_errors``)
instead of argparse's own ``sys.exit(2)`` with the usage, so ``main()`` stays in charge.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import torch

from usmkit.decoding.ctc_lexicon import LEXICON_DIR, LEXICON_FILE, STREAMING_LEXICON, TOKENS_FILE
from usmkit.device import resolve_device
from usmkit.errors import UsageError
from usmkit.streaming.decoder import DecoderConfig, EndpointConfig


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


log = logging.getLogger(__name__)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def finite_nonnegative(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def finite_positive(text: str) -> float:
    value = finite_nonnegative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def decibels_fs(text: str) -> float:
    """A level in dBFS: finite and at most 0 (full scale)."""
    value = finite_float(text)
    if value > 0:
        raise argparse.ArgumentTypeError(f"must be a level in dBFS, at most 0, got {text}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 0 to 65535 (0: any free port), got {text}")
    return value


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """Chunking, CTC decoding and rescoring, endpointing, device and threads of a streaming recognizer."""
    p.add_argument(
        "--chunk-size", type=positive_int, help="encoder frames per chunk (40 ms each); default: the model's"
    )
    p.add_argument("--left-chunks", type=nonnegative_int, help="chunks of attention history; default: the model's")
    p.add_argument("--decode", choices=("ctc_greedy", "ctc_beam"), help="default ctc_greedy (ctc_beam with --rescore)")
    p.add_argument("--beam-size", type=positive_int, default=8)
    p.add_argument("--rescore", action="store_true", help="rescore each segment's n-best with the LAS decoder")
    p.add_argument("--rescore-ctc-weight", type=finite_nonnegative, default=0.3)
    p.add_argument(
        "--endpoint-blank", type=finite_positive, default=0.8, help="seconds of trailing blank that end a segment"
    )
    p.add_argument(
        "--endpoint-silence", type=finite_positive, default=0.5, help="seconds of trailing silence that end a segment"
    )
    p.add_argument("--max-segment", type=finite_positive, default=20.0, help="longest segment in seconds")
    p.add_argument("--silence-db", type=decibels_fs, default=-50.0, help="audio below this level (dBFS) is silence")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")


def device_arg(name: str) -> torch.device:
    """``--device``: cpu, cuda, cuda:N or auto; ``UsageError`` naming the option for anything else."""
    try:
        return resolve_device(name)
    except UsageError as e:
        raise UsageError(f"--{e}".replace("--device=", "--device ", 1)) from None


def decoder_config(args: argparse.Namespace) -> DecoderConfig:
    """The decoding and endpointing settings of ``add_stream_options``' arguments."""
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


def add_model_options(p: argparse.ArgumentParser) -> None:
    """``--checkpoint`` or ``--engine onnx|aoti --model EXPORT_DIR``: what runs the encoder step."""
    p.add_argument("--checkpoint", help="checkpoint dir, or an experiment dir (its best/latest checkpoint)")
    p.add_argument(
        "--engine",
        choices=("torch", "onnx", "aoti"),
        default="torch",
        help="what runs the encoder step: torch = the --checkpoint in PyTorch (default); onnx / aoti = an "
        "exported model (--model DIR, made by python -m usmkit.cli.export) under onnxruntime / AOTInductor",
    )
    p.add_argument("--model", help="export directory for --engine onnx|aoti (holds export.json)")


def add_lexicon_options(p: argparse.ArgumentParser) -> None:
    """``--lexicon`` and its weights: finals that spell only words of the training transcripts."""
    p.add_argument(
        "--lexicon",
        action="store_true",
        help="finals spell only words of the model's training transcripts, scored with their word LM (built from "
        "the checkpoint's training manifests, or bundled in an export)",
    )
    p.add_argument(
        "--lm-weight",
        type=finite_nonnegative,
        help=f"with --lexicon: weight of the word LM (default {STREAMING_LEXICON.lm_weight}, or the export's)",
    )
    p.add_argument(
        "--word-score",
        type=finite_float,
        help=f"with --lexicon: score added per word (default {STREAMING_LEXICON.word_score}, or the export's)",
    )
    p.add_argument(
        "--bias-phrases",
        type=Path,
        help="with --lexicon: a file of phrases to favour, one a line, optionally a tab and its boost per word "
        "(default 5); their words join the lexicon (contextual biasing: names, numbers, jargon)",
    )


def load_exported(args: argparse.Namespace, device: torch.device):
    """``--engine onnx|aoti --model DIR``: the export (``usmkit.export.engine.LoadedExport``), refusing the
    options that do not go with it with a line saying why."""
    from usmkit.export.engine import load_export

    flag = f"--engine {args.engine}"
    if not args.model:
        raise UsageError(
            f"{flag} needs --model EXPORT_DIR (made by python -m usmkit.cli.export checkpoint=... out=...)"
        )
    refused = {
        "--checkpoint": args.checkpoint and "the export directory replaces it: pass it as --model",
        "--quantize int8": args.quantize != "none" and "export with quantize=int8 instead",
        "--rescore": args.rescore and "an export has no LAS decoder; rescore with --checkpoint",
        "--no-streaming": getattr(args, "no_streaming", False)
        and "an engine runs the streaming step; use --checkpoint",
        f"--device {args.device}": device.type != "cpu" and "exported engines run on the CPU",
    }
    for option, why in refused.items():
        if why:
            raise UsageError(f"{option} does not go with {flag}: {why}")
    loaded = load_export(args.model)
    if loaded.manifest.format != args.engine:
        raise UsageError(f"--model {args.model} holds an export of format {loaded.manifest.format}; pass --engine "
                         f"{loaded.manifest.format}")  # fmt: skip
    for option, value, exported in (
        ("--chunk-size", args.chunk_size, loaded.manifest.chunk_size),
        ("--left-chunks", args.left_chunks, loaded.manifest.left_chunks),
    ):
        if value is not None and value != exported:
            raise UsageError(
                f"{option} {value}: the export was made for {exported}; export the model again to change it"
            )
    return loaded


def check_model_choice(args: argparse.Namespace) -> None:
    """``--engine torch`` (the default) needs ``--checkpoint`` and takes no ``--model``."""
    if args.engine != "torch":
        return
    if not args.checkpoint:
        raise UsageError("no model: pass --checkpoint DIR (or --engine onnx|aoti --model EXPORT_DIR)")
    if args.model:
        raise UsageError(f"--model {args.model} is for --engine onnx|aoti; with PyTorch pass --checkpoint")


def lexicon_decoder(args: argparse.Namespace, loaded):
    """With ``--lexicon``: the ``LexiconDecoder`` of the model's training transcripts (None without it).
    ``loaded``: an export (its bundled lexicon and settings, ``--lm-weight`` / ``--word-score`` replacing
    them) or a checkpoint (``usmkit.streaming.pipeline.LoadedModel``: the lexicon and LM its experiment carries,
    ``run_lexicon``, else built from its training manifests as ``usmkit.cli.evaluate decode=ctc_lexicon`` builds
    it; ``STREAMING_LEXICON``'s settings)."""
    if not args.lexicon:
        if args.bias_phrases:
            raise UsageError(f"--bias-phrases {args.bias_phrases} boosts phrases in the lexicon search: add --lexicon")
        return None
    if args.rescore:
        raise UsageError("--lexicon and --rescore both choose the finals: pass one of them")
    changes = {"lm_weight": args.lm_weight, "word_score": args.word_score}
    bias = ()
    if args.bias_phrases:
        from usmkit.decoding.biasing import read_bias_phrases

        bias = read_bias_phrases(args.bias_phrases)
    from usmkit.export.engine import LoadedExport

    if isinstance(loaded, LoadedExport):
        if bias and loaded.lexicon_config(**changes).lm_weight <= 0:
            raise UsageError("--bias-phrases adds to the word LM's score: use --lm-weight > 0")
        return loaded.word_decoder(bias, **changes)
    from dataclasses import replace

    from usmkit.checkpointing.checkpoint import run_dir
    from usmkit.decoding.ctc_lexicon import LexiconDecoder
    from usmkit.inference.evaluate import EvalConfig, build_word_decoder

    lexicon = replace(STREAMING_LEXICON, **{k: v for k, v in changes.items() if v is not None})
    if bias and lexicon.lm_weight <= 0:
        raise UsageError("--bias-phrases adds to the word LM's score: use --lm-weight > 0")
    carried = run_lexicon(loaded)
    if carried is not None:
        return LexiconDecoder(loaded.tokenizer, carried, lexicon, bias)
    cfg = EvalConfig(checkpoint=str(loaded.checkpoint), decode="ctc_lexicon", lexicon=lexicon)
    try:
        return build_word_decoder(cfg, loaded.cfg, loaded.tokenizer, bias=bias)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(
            f"--lexicon: {run_dir(loaded.checkpoint)} carries no {LEXICON_DIR}/, and the training transcripts it is "
            f"rebuilt from could not be read: {e}. Run from the folder the model was trained in (its "
            f"data.manifest_dir, {loaded.cfg.data.manifest_dir}, is read from there), or train it again: training "
            f"writes {LEXICON_DIR}/ into the experiment"
        ) from e


def run_lexicon(loaded) -> Path | None:
    """The lexicon folder the checkpoint's experiment carries (``usmkit.training.run_lexicon``), None when it has
    none or one written for another tokenizer (its lexicon is then rebuilt from the training manifests)."""
    from usmkit.checkpointing.checkpoint import run_dir

    folder = run_dir(loaded.checkpoint) / LEXICON_DIR
    if not (folder / LEXICON_FILE).is_file() or not (folder / TOKENS_FILE).is_file():
        return None
    pieces = [loaded.tokenizer.id_to_piece(i) for i in range(loaded.tokenizer.vocab_size)]
    if (folder / TOKENS_FILE).read_text(encoding="utf-8").splitlines() != pieces:
        log.warning("%s was written for another tokenizer than %s's: rebuilding the lexicon", folder, loaded.checkpoint)
        return None
    return folder
