"""Fixtures of the server tests: tiny streaming checkpoints, test audio, and a server on a background thread.

The checkpoints and audio are the streaming tests' (``tests/streaming/test_transcribe_cli.py``: tiny
preset, causal convolution, chunk_size=4, left_chunks=2, random weights). ``audio_ckpt`` keeps the
CTC head's random weights, so its (garbage) text depends on the audio: two recordings give two
transcripts. ``word_ckpt`` says one word wherever there is sound, so its text does not change when the
audio is shifted or resampled a little (the browser test needs that).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "streaming"))  # the streaming tests' builders
from test_transcribe_cli import SR, make_checkpoint, speech_silence_speech, speechlike  # noqa: E402

from usmkit.cli.serve import build_parser, build_recognizer  # noqa: E402
from usmkit.serve.server import ServeConfig, Server  # noqa: E402

__all__ = ["SR", "speech_silence_speech", "speechlike"]


@pytest.fixture(scope="session")
def audio_ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("serve_audio_ckpt"), one_word=False)


@pytest.fixture(scope="session")
def word_ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("serve_word_ckpt"))


@pytest.fixture(scope="session")
def las_ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("serve_las_ckpt"), kind="las", one_word=False)


def recordings(tmp: Path) -> dict[str, Path]:
    """Two different 16 kHz recordings: speech, silence, speech (3.6 s) and another voice (2.4 s, one segment)."""
    paths = {"a": tmp / "a.wav", "b": tmp / "b.wav"}
    sf.write(paths["a"], speech_silence_speech(), SR, subtype="PCM_16")
    b = np.concatenate([speechlike(2.0, seed=7, level=0.2), np.zeros(int(0.4 * SR), np.float32)])
    sf.write(paths["b"], b, SR, subtype="PCM_16")
    return paths


@pytest.fixture(scope="session")
def wavs(tmp_path_factory) -> dict[str, Path]:
    return recordings(tmp_path_factory.mktemp("serve_audio"))


def pcm_bytes(path: Path) -> bytes:
    """A 16-bit WAV's samples as the raw little-endian bytes a client sends."""
    samples, rate = sf.read(path, dtype="int16")
    assert rate == SR
    return samples.astype("<i2").tobytes()


def recognizer_for(checkpoint: Path, *flags: str):
    recognizer = build_recognizer(build_parser().parse_args(["--checkpoint", str(checkpoint), *flags]))
    recognizer.warm_up()
    return recognizer


@dataclass
class RunningServer:
    """A ``Server`` on its own event loop in a background thread; ``url`` is its WebSocket address."""

    server: Server
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    thread: threading.Thread
    url: str = field(init=False)

    def __post_init__(self) -> None:
        self.url = f"ws://127.0.0.1:{self.server.port}/"

    def call(self, fn):
        """fn() on the server's loop (its state is the loop's); returns the result."""
        return asyncio.run_coroutine_threadsafe(_call(fn), self.loop).result(timeout=10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)


async def _call(fn):
    return fn()


def start_server(recognizer, **cfg) -> RunningServer:
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            try:
                async with Server(recognizer, ServeConfig(**{"port": 0, **cfg})) as server:
                    box["running"] = (server, asyncio.get_running_loop(), stop)
                    ready.set()
                    await stop.wait()
            except Exception as e:  # noqa: BLE001 - handed to the caller, which raises it
                box["error"] = e
                ready.set()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True, name="usmkit-serve-test")
    thread.start()
    ready.wait(timeout=60)
    if "error" in box:
        raise box["error"]
    server, loop, stop = box["running"]
    return RunningServer(server, loop, stop, thread)


def messages_until_closed(ws, timeout: float = 30.0) -> tuple[list[dict], int | None]:
    """Every message the server sends until it closes the connection, and its close code."""
    from websockets.exceptions import ConnectionClosed

    out = []
    try:
        while True:
            out.append(json.loads(ws.recv(timeout=timeout)))
    except ConnectionClosed as e:
        return out, e.rcvd.code if e.rcvd is not None else None
