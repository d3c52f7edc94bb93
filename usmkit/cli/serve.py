"""``usmkit-serve``: the command line of the WebSocket server (``usmkit.serve.server``).

usmkit-serve --checkpoint exp/demo_ctc [--host 127.0.0.1 --port 10086] [--quantize int8] [--lexicon]
usmkit-serve --engine onnx --model exp/demo_ctc/export_onnx --lexicon     # python -m usmkit.cli.export
usmkit-serve --checkpoint exp/demo_ctc --token "$SECRET" --max-connections 32
usmkit-serve --checkpoint exp/demo_ctc --allowed-origins https://app.example --idle-timeout 60

The model options (``--checkpoint`` or ``--engine onnx|aoti --model DIR``) and ``--lexicon`` are
``usmkit-transcribe``'s (``usmkit.cli.args``): the same finals from both commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time

import torch

from usmkit.cli.args import (
    UsageParser,
    add_lexicon_options,
    add_model_options,
    add_stream_options,
    check_model_choice,
    decoder_config,
    device_arg,
    finite_nonnegative,
    finite_positive,
    lexicon_decoder,
    load_exported,
    port_number,
    positive_float,
    positive_int,
)
from usmkit.errors import UsageError, strip_debug_flag, user_errors
from usmkit.serve.config import ServeConfig
from usmkit.serve.server import serve_until_stopped
from usmkit.serve.session import Recognizer
from usmkit.streaming.pipeline import ModelError, load_model, streaming_mask
from usmkit.streaming.quantize import quantize_linear_int8

log = logging.getLogger("usmkit.serve")

TOKEN_ENV = "USMKIT_SERVE_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="usmkit-serve",
        description="Streaming speech recognition over WebSocket (WeNet's protocol), with a browser page at /.",
    )
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=port_number, default=10086, help="TCP port (0: any free port; the log says which)")
    p.add_argument("--max-connections", type=positive_int, default=64, help="clients served at once")
    p.add_argument("--max-seconds", type=positive_float, default=3600.0, help="longest audio of one stream (s)")
    p.add_argument("--max-batch", type=positive_int, default=32, help="most streams in one encoder step")
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"shared secret clients (and /stats) must send (?token=... or Authorization: Bearer ...); "
        f"default ${TOKEN_ENV}",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated web origins (https://app.example) whose pages may open sockets, besides the "
        "server's own page; '*' allows any page. Clients that are not browsers send no Origin and are allowed",
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated host names (asr.example) clients may reach the server by, besides its address, "
        "loopback names and --host; '*' allows any. Others get HTTP 403 (a page whose name was made to resolve to "
        "this server, DNS rebinding, sends its own name)",
    )
    p.add_argument(
        "--max-buffer-seconds",
        type=finite_positive,
        default=60.0,
        help="audio a stream may hold undecoded; reading its socket pauses beyond it. Also the largest "
        "binary message (default 60 s)",
    )
    p.add_argument(
        "--max-messages-per-second",
        type=finite_positive,
        default=1000.0,
        help="messages read per connection per second (bursts of one second's worth); reading pauses beyond",
    )
    p.add_argument(
        "--start-timeout", type=finite_positive, default=10.0, help="close a connection without a start signal (s)"
    )
    p.add_argument(
        "--idle-timeout",
        type=finite_positive,
        default=30.0,
        help="end a started stream that sends nothing for this long (s): its results, then a message",
    )
    p.add_argument(
        "--drain-seconds",
        type=finite_nonnegative,
        default=10.0,
        help="on SIGTERM / Ctrl-C: the longest wait for open streams to get their results (s)",
    )
    add_stream_options(p)
    add_lexicon_options(p)
    p.add_argument(
        "--step",
        choices=("auto", "jit", "eager", "graphs"),
        default="auto",
        help="encoder step of a --checkpoint: traced graph, plain PyTorch, or (GPU) plain PyTorch recorded as one "
        "CUDA graph per batch size up to --max-batch; auto: traced on a CPU, graphs on a GPU (an export runs its "
        "engine)",
    )
    p.add_argument("--bf16", action="store_true", help="--step graphs under bf16 autocast (GPU)")
    p.add_argument("--quantize", choices=("none", "int8"), default="none", help="int8 linear weights (CPU only)")
    return p


def build_recognizer(args) -> Recognizer:
    """The model and decoding settings from the parsed arguments; ``UsageError`` for what the user can fix."""
    device = device_arg(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    elif device.type == "cuda":
        # The host's share of a GPU server is small per-stream work (framing, decoding) between the steps: a pool of
        # threads would only wait on itself and crowd the event loop's core.
        torch.set_num_threads(1)
    decoder_cfg = decoder_config(args)
    check_model_choice(args)
    if args.engine != "torch":
        exported = load_exported(args, device)
        words = lexicon_decoder(args, exported)
        C, K = exported.manifest.chunk_size, exported.manifest.left_chunks
        return Recognizer(exported.model, exported.tokenizer, exported.features, exported.stats, decoder_cfg, C, K,
                          silence_db=args.silence_db, step=exported.step, words=words)  # fmt: skip
    try:
        loaded = load_model(args.checkpoint, device, rescore=args.rescore)
        C, K, warning = streaming_mask(loaded.model, args.chunk_size, args.left_chunks, args.checkpoint)
    except ModelError as e:
        raise UsageError(str(e)) from e
    if warning:
        log.warning("%s", warning)
    words = lexicon_decoder(args, loaded)
    model = loaded.model
    if args.quantize == "int8":
        if device.type != "cpu":
            raise UsageError(f"--quantize int8 runs on the CPU only; drop it or use --device cpu (got {device})")
        model = quantize_linear_int8(model)
    step = chosen_step(args.step, device)
    if step == "graphs" and device.type != "cuda":
        raise UsageError(f"--step graphs records CUDA graphs: use --device cuda, or another --step (got {device})")
    if args.bf16 and step != "graphs":
        raise UsageError(f"--bf16 is for --step graphs, not --step {step}")
    return Recognizer(model, loaded.tokenizer, loaded.cfg.data.features, loaded.stats, decoder_cfg, C, K,
                      silence_db=args.silence_db, step=step, words=words, max_batch=args.max_batch,
                      bf16=args.bf16)  # fmt: skip


def chosen_step(step: str, device: torch.device) -> str:
    """``--step``, with ``auto`` resolved: the traced graph on a CPU, CUDA graphs on a CUDA GPU, else plain PyTorch."""
    if step != "auto":
        return step
    return {"cpu": "jit", "cuda": "graphs"}.get(device.type, "eager")


def main(argv: list[str] | None = None) -> int:
    """Console entry point: 0 after a clean stop (Ctrl-C / SIGTERM), 2 for bad usage, 1 for a failure."""
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    with user_errors():
        args = build_parser().parse_args(argv)
        cfg = ServeConfig(
            host=args.host,
            port=args.port,
            max_connections=args.max_connections,
            max_seconds=args.max_seconds,
            max_batch=args.max_batch,
            token=args.token or None,
            max_buffer_seconds=args.max_buffer_seconds,
            max_messages_per_second=args.max_messages_per_second,
            start_timeout=args.start_timeout,
            idle_timeout=args.idle_timeout,
            allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
            allowed_hosts=tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip()),
            drain_seconds=args.drain_seconds,
        )
        start = time.perf_counter()
        recognizer = build_recognizer(args)
        recognizer.warm_up()
        finals = " + rescoring" if recognizer.decoder_cfg.rescore else " + lexicon finals" if args.lexicon else ""
        log.info(
            "model %s: chunk %g ms, %d left chunks, %s, %s step%s, ready in %.1f s",
            args.checkpoint or args.model,
            recognizer.chunk_size * recognizer.model.encoder.subsampling_factor * recognizer.features.frame_shift_ms,
            recognizer.left_chunks,
            recognizer.decoder_cfg.mode + finals,
            chosen_step(args.step, recognizer.device) if args.engine == "torch" else args.engine,
            ", int8 weights" if args.quantize == "int8" else "",
            time.perf_counter() - start,
        )
        if cfg.token is None and cfg.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("listening on %s without --token: anyone who can reach the port can use the server", cfg.host)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_until_stopped(recognizer, cfg, ready=lambda line: print(line, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
