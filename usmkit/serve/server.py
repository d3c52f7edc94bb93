"""``usmkit-serve``: streaming recognition over WebSocket (WeNet's protocol), and a browser page.

    usmkit-serve --checkpoint exp/demo_ctc [--host 127.0.0.1 --port 10086] [--quantize int8]
    usmkit-serve --checkpoint exp/demo_ctc --token "$SECRET" --max-connections 32

The command line (``usmkit.cli.serve``) builds the ``Recognizer`` and runs ``serve_until_stopped``.

One asyncio process (the ``websockets`` package). Each connection speaks ``usmkit.serve.protocol``;
its audio goes to a ``ServerStream`` (the command line's streaming pipeline), and the ``Batcher``
runs the chunks of all streams that are ready as one batched encoder step, in a worker thread, so
the event loop keeps accepting and reading while the model runs. Plain HTTP GETs on the same port
serve the page (``/``: microphone -> 16 kHz PCM -> the socket, live results; files under
``usmkit/serve/page/``) and ``/stats`` (JSON counters).

Limits: ``--max-connections`` (more are refused with a message), ``--max-seconds`` of audio per
stream (the audio up to it is decoded and sent, then the stream fails with a message), ``--token``
(or ``$USMKIT_SERVE_TOKEN``): a shared secret each WebSocket client must send, as ``?token=...`` in
the URL or an ``Authorization: Bearer ...`` header. Any error a client causes is sent to it as
``{"status": "failed", "message": ...}`` before its connection is closed; the others go on.
Binds to the loopback interface unless ``--host`` says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import time
from dataclasses import dataclass
from http import HTTPStatus
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from usmkit.errors import UsageError
from usmkit.serve.batcher import Batcher, Error
from usmkit.serve.protocol import (
    EndSignal,
    PcmDecoder,
    ProtocolError,
    Start,
    failed,
    final_result,
    parse_signal,
    partial_result,
    server_ready,
    speech_end,
)
from usmkit.serve.session import End, Final, Partial, Recognizer, ServerStream

log = logging.getLogger("usmkit.serve")

CLOSE_NORMAL, CLOSE_POLICY, CLOSE_ERROR, CLOSE_TRY_LATER = 1000, 1008, 1011, 1013
PAGE_FILES = {  # URL path -> (file under usmkit/serve/page, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/pcm-worklet.js": ("pcm-worklet.js", "text/javascript; charset=utf-8"),
    "/resampler.js": ("resampler.js", "text/javascript; charset=utf-8"),
}


@dataclass(frozen=True)
class ServeConfig:
    """Where the server listens and what it allows (``usmkit-serve --help`` explains each)."""

    host: str = "127.0.0.1"
    port: int = 10086
    max_connections: int = 64
    max_seconds: float = 3600.0
    max_batch: int = 32
    token: str | None = None
    max_message_bytes: int = 1 << 20  # one binary message: 32 s of 16 kHz PCM

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_batch < 1 or self.max_seconds <= 0:
            raise ValueError(
                f"max_connections and max_batch must be >= 1 and max_seconds > 0, got {self.max_connections}, "
                f"{self.max_batch} and {self.max_seconds}"
            )


class Connection:
    """One client: reads its messages, feeds its stream, writes its results in order (an outbox)."""

    def __init__(self, server: Server, ws: ServerConnection, peer: str) -> None:
        self.server = server
        self.ws = ws
        self.peer = peer
        self.stream: ServerStream | None = None
        self.start: Start | None = None
        self.pcm = PcmDecoder()
        self.ended = False  # the end signal came (or the --max-seconds limit stood in for it)
        self.over_limit = False
        self.audio_s = 0.0  # audio received
        self.outcome = "client left"  # for the log
        self._outbox: asyncio.Queue[str | tuple[int, str]] = asyncio.Queue()
        self._closing = False

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            async for message in self.ws:
                if self._closing:
                    break
                try:
                    if isinstance(message, str):
                        self._on_text(message)
                    else:
                        self._on_audio(message)
                except ProtocolError as e:
                    self.fail(str(e), CLOSE_POLICY)
        except ConnectionClosed:
            pass  # the client vanished mid-stream
        finally:
            if self._closing:
                with contextlib.suppress(ConnectionClosed):
                    await writer  # what is queued, then the close
            else:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                item = await self._outbox.get()
                if isinstance(item, tuple):  # (close code, reason): the last item
                    await self.ws.close(*item)
                    return
                await self.ws.send(item)

    def _close(self, code: int, reason: str = "") -> None:
        self._closing = True
        self._outbox.put_nowait((code, reason))
        self.release()

    def fail(self, message: str, code: int = CLOSE_ERROR) -> None:
        """Send ``{"status": "failed", "message": ...}``, then close."""
        if self._closing:
            return
        log.warning("%s: %s", self.peer, message)
        self.outcome = f"failed: {message}"
        self._outbox.put_nowait(failed(message))
        self._close(code, "failed")

    def release(self) -> None:
        """Detach the stream from the batcher (its state is dropped with it)."""
        if self.stream is not None:
            self.server.batcher.remove(self.stream)
            self.stream = None

    # ------------------------------------------------------------------ client messages
    def _on_text(self, text: str) -> None:
        signal_ = parse_signal(text)
        if isinstance(signal_, Start):
            if self.start is not None:
                raise ProtocolError('the stream has already started: send audio, then {"signal": "end"}')
            self.start = signal_
            self.stream = self.server.recognizer.new_stream(signal_.nbest, signal_.continuous_decoding)
            self.server.batcher.add(self.stream, self.deliver)
            self._outbox.put_nowait(server_ready())
            return
        assert isinstance(signal_, EndSignal)
        if self.start is None:
            raise ProtocolError('end signal before the start signal: send {"signal": "start"} first')
        if self.over_limit:
            return  # the limit already ended the stream; its message follows its last results
        if self.ended:
            raise ProtocolError("the end signal came twice")
        self.ended = True
        self.stream.end()
        self.server.batcher.notify(self.stream)

    def _on_audio(self, data: bytes) -> None:
        if self.start is None:
            raise ProtocolError('audio before the start signal: send {"signal": "start"} first, then binary PCM')
        if self.over_limit:
            return  # past --max-seconds: dropped; the stream is being finished
        if self.ended:
            raise ProtocolError("audio after the end signal")
        samples = self.pcm(data)
        limit = round(self.server.cfg.max_seconds * self.stream.sample_rate)
        room = limit - self.stream.samples_in
        if samples.size > room:
            samples = samples[: max(room, 0)]
            self.over_limit = self.ended = True
        if samples.size:
            self.stream.push(samples)
            self.audio_s += samples.size / self.stream.sample_rate
        if self.over_limit:
            self.stream.end()
        self.server.batcher.notify(self.stream)

    # ------------------------------------------------------------------ results (from the batcher)
    def deliver(self, events: list) -> None:
        for event in events:
            if self._closing:
                return
            if isinstance(event, Partial):
                self._outbox.put_nowait(partial_result(event.texts, event.audio_ms))
            elif isinstance(event, Final):
                self._outbox.put_nowait(final_result(event.segment, self.start.nbest, event.audio_ms))
            elif isinstance(event, End):
                if self.over_limit:
                    self.fail(
                        f"the stream reached the server's limit of {self.server.cfg.max_seconds:g} s of audio "
                        "(--max-seconds): the results above cover the audio up to it, the rest was dropped; "
                        "start a new stream for more",
                        CLOSE_POLICY,
                    )
                else:
                    self.outcome = "done"
                    self._outbox.put_nowait(speech_end())
                    self._close(CLOSE_NORMAL)
            elif isinstance(event, Error):
                self.fail(event.message, CLOSE_ERROR)


class Server:
    """The WebSocket server around a ``Recognizer``: ``async with Server(...) as s:`` listens on ``s.port``."""

    def __init__(self, recognizer: Recognizer, cfg: ServeConfig = ServeConfig()) -> None:
        self.recognizer = recognizer
        self.cfg = cfg
        self.batcher = Batcher(recognizer, cfg.max_batch)
        self.connections: set[Connection] = set()
        self.port: int | None = None
        self._ws_server = None
        self._batcher_task: asyncio.Task | None = None

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        self._batcher_task = asyncio.create_task(self.batcher.run())
        try:
            self._ws_server = await serve(
                self._handle,
                self.cfg.host,
                self.cfg.port,
                process_request=self._http,
                max_size=self.cfg.max_message_bytes,
                compression=None,  # PCM does not compress; deflating it costs both sides CPU
            )
        except OSError as e:
            self._batcher_task.cancel()
            raise UsageError(
                f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e.strerror or e}; pick another --port or --host"
            ) from e
        self.port = self._ws_server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._ws_server is not None:
            self._ws_server.close()
            await self._ws_server.wait_closed()
        if self._batcher_task is not None:
            self._batcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher_task
        await asyncio.get_running_loop().run_in_executor(None, self.batcher.close)

    def stats(self) -> dict:
        return {"connections": len(self.connections), "streams": self.batcher.streams, **self.batcher.stats.as_dict()}

    # ------------------------------------------------------------------ HTTP: the page and /stats
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return None  # the WebSocket handshake goes on
        path = urlsplit(request.path).path
        if path == "/stats":
            return _response(connection, HTTPStatus.OK, json.dumps(self.stats()) + "\n", "application/json")
        if path not in PAGE_FILES:
            return _response(connection, HTTPStatus.NOT_FOUND, f"no page at {path}; the page is at /\n", "text/plain")
        name, content_type = PAGE_FILES[path]
        return _response(connection, HTTPStatus.OK, page_file(name), content_type)

    # ------------------------------------------------------------------ WebSocket connections
    def _authorized(self, request: Request) -> bool:
        if self.cfg.token is None:
            return True
        offered = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            offered = offered or auth[len("Bearer ") :]
        return hmac.compare_digest(offered.encode(), self.cfg.token.encode())

    async def _handle(self, ws: ServerConnection) -> None:
        peer = _peer(ws)
        if not self._authorized(ws.request):
            log.warning("refused %s: missing or wrong token", peer)
            await _refuse(ws, "missing or wrong token: add ?token=... to the URL (or an Authorization: Bearer header)")
            return
        if len(self.connections) >= self.cfg.max_connections:
            log.warning("refused %s: %d connections already", peer, len(self.connections))
            await _refuse(
                ws,
                f"the server is busy: it serves at most {self.cfg.max_connections} connections at a time "
                "(--max-connections); try again later",
                CLOSE_TRY_LATER,
            )
            return
        conn = Connection(self, ws, peer)
        self.connections.add(conn)
        started = time.monotonic()
        log.info("connect %s (%d/%d connections)", peer, len(self.connections), self.cfg.max_connections)
        try:
            await conn.run()
        finally:
            conn.release()
            self.connections.discard(conn)
            log.info(
                "disconnect %s: %s, %.1f s of audio in %.1f s (%d/%d connections)",
                peer,
                conn.outcome,
                conn.audio_s,
                time.monotonic() - started,
                len(self.connections),
                self.cfg.max_connections,
            )


def _peer(ws: ServerConnection) -> str:
    address = ws.remote_address
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


async def _refuse(ws: ServerConnection, message: str, code: int = CLOSE_POLICY) -> None:
    with contextlib.suppress(ConnectionClosed):
        await ws.send(failed(message))
        await ws.close(code, "refused")


def _response(connection: ServerConnection, status: HTTPStatus, body: str, content_type: str) -> Response:
    response = connection.respond(status, body)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-cache"
    return response


def page_file(name: str) -> str:
    """A file of the browser page (``usmkit/serve/page/``)."""
    return resources.files("usmkit.serve").joinpath("page", name).read_text(encoding="utf-8")


async def serve_until_stopped(recognizer: Recognizer, cfg: ServeConfig, ready=print) -> None:
    """Serve until SIGINT / SIGTERM; ``ready(line)`` gets the listening address once the port is bound."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with Server(recognizer, cfg) as server:
        ready(f"usmkit-serve: listening on ws://{cfg.host}:{server.port} (page: http://{cfg.host}:{server.port}/)")
        await stop.wait()
        log.info("stopping: %d connections open", len(server.connections))
