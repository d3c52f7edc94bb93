"""argparse pieces shared by the entry points that use argparse (usmkit-transcribe, usmkit-serve).

``add_stream_options`` defines the options both read the same way (through
``usmkit.transcribe._decoder_config`` and ``_device``): chunking, decoding, endpointing, device.

A bad argument raises ``UsageError`` (one line, exit code 2, through ``usmkit.errors.user_errors``)
instead of argparse's own ``sys.exit(2)`` with the usage, so ``main()`` stays in charge.
"""

from __future__ import annotations

import argparse

from usmkit.errors import UsageError


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
