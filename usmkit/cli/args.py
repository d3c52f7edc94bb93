"""argparse pieces shared by the console scripts (usmkit-transcribe, usmkit-serve, usmkit-average).

``add_stream_options`` defines the options of a streaming recognizer, and ``decoder_config`` and
``device_arg`` read them, the same way for every command: chunking, decoding, endpointing, device.

A bad argument raises ``UsageError`` (one line, exit code 2, through ``usmkit.errors.user_errors``)
instead of argparse's own ``sys.exit(2)`` with the usage, so ``main()`` stays in charge.
"""

from __future__ import annotations

import argparse

import torch

from usmkit.device import resolve_device
from usmkit.errors import UsageError
from usmkit.streaming.decoder import DecoderConfig, EndpointConfig


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


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


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """Chunking, CTC decoding and rescoring, endpointing, device and threads of a streaming recognizer."""
    p.add_argument(
        "--chunk-size", type=positive_int, help="encoder frames per chunk (40 ms each); default: the model's"
    )
    p.add_argument("--left-chunks", type=nonnegative_int, help="chunks of attention history; default: the model's")
    p.add_argument("--decode", choices=("ctc_greedy", "ctc_beam"), help="default ctc_greedy (ctc_beam with --rescore)")
    p.add_argument("--beam-size", type=positive_int, default=8)
    p.add_argument("--rescore", action="store_true", help="rescore each segment's n-best with the LAS decoder")
    p.add_argument("--rescore-ctc-weight", type=float, default=0.3)
    p.add_argument("--endpoint-blank", type=float, default=0.8, help="seconds of trailing blank that end a segment")
    p.add_argument("--endpoint-silence", type=float, default=0.5, help="seconds of trailing silence that end a segment")
    p.add_argument("--max-segment", type=float, default=20.0, help="longest segment in seconds")
    p.add_argument("--silence-db", type=float, default=-50.0, help="audio below this level (dBFS) is silence")
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
