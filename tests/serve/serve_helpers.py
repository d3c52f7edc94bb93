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
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

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
    out = []
    try:
        while True:
            out.append(json.loads(ws.recv(timeout=timeout)))
    except ConnectionClosed as e:
        return out, e.rcvd.code if e.rcvd is not None else None


class Gate:
    """Holds the server's worker at its next encoder step until ``release()``, so that audio piles up in the
    streams meanwhile, as it does on a loaded server. ``with Gate(recognizer) as gate: ...``; ``held`` is
    set once the worker waits at the gate."""

    def __init__(self, recognizer) -> None:
        self.recognizer = recognizer
        self._step = recognizer.step
        self._released = threading.Event()
        self.held = threading.Event()

    def __enter__(self) -> Gate:
        self.recognizer.step = self._held_step
        return self

    def _held_step(self, *args):
        self.held.set()
        self._released.wait(timeout=60)
        return self._step(*args)

    def release(self) -> None:
        self._released.set()

    def __exit__(self, *exc) -> None:
        self._released.set()
        self.recognizer.step = self._step


def wait_until(predicate, timeout: float = 20.0) -> bool:
    """Poll ``predicate()`` until it is true; whether it became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def settled(value, quiet: float = 0.5, timeout: float = 20.0):
    """Poll ``value()`` until it has not changed for ``quiet`` seconds (or ``timeout`` passed); its last value."""
    deadline = time.monotonic() + timeout
    last, since = value(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.05)
        now = value()
        if now != last:
            last, since = now, time.monotonic()
    return last


def samples_in(running: RunningServer) -> list[int]:
    """Samples each open stream on the server has received."""
    return running.call(lambda: [c.stream.samples_in for c in running.server.connections if c.stream is not None])


def stream(
    url: str,
    pcm: bytes,
    start: dict | None = None,
    block: int = 3200,
    pace_s: float = 0.0,
    ready: threading.Barrier | None = None,
):
    """Start, the PCM in ``block``-byte messages (``pace_s`` apart), end; every message back and the close code.
    With ``ready``, the audio goes only once every client sharing the barrier has its stream started."""
    with connect(url, open_timeout=10) as ws:
        ws.send(json.dumps(start or {"signal": "start", "nbest": 1, "continuous_decoding": True}))
        assert json.loads(ws.recv(timeout=10)) == {"status": "ok", "type": "server_ready"}
        if ready is not None:
            ready.wait(timeout=30)
        for i in range(0, len(pcm), block):
            try:
                ws.send(pcm[i : i + block])
            except ConnectionClosed:  # the server ended the stream (its first final, or a limit)
                break
            time.sleep(pace_s)
        try:
            ws.send(json.dumps({"signal": "end"}))
        except ConnectionClosed:
            pass
        return messages_until_closed(ws)


def best_finals(messages: list[dict]) -> list[dict]:
    """The best path of each non-empty final result."""
    paths = [json.loads(m["nbest"])[0] for m in messages if m.get("type") == "final_result"]
    return [p for p in paths if p["sentence"]]
