"""``usmkit-serve``: streaming recognition over WebSocket (WeNet's protocol), and a browser page.

    usmkit-serve --checkpoint exp/demo_ctc [--host 127.0.0.1 --port 10086] [--quantize int8]
    usmkit-serve --checkpoint exp/demo_ctc --token "$SECRET" --max-connections 32

The command line (``usmkit.cli.serve``) builds the ``Recognizer`` and runs ``serve_until_stopped``.

One asyncio process (the ``websockets`` package). Each connection (``connection``) speaks
``usmkit.serve.protocol``; its audio goes to a ``ServerStream`` (the command line's streaming
pipeline), and the ``Batcher`` runs the chunks of all streams that are ready as one batched encoder
step, in a worker thread, so the event loop keeps accepting and reading while the model runs. Plain
HTTP GETs (and HEADs) on the same port serve the page (``/``: microphone -> 16 kHz PCM -> the socket,
live results; files under ``usmkit/serve/page/``) and ``/stats`` (JSON counters).

Limits (``ServeConfig``; ``docs/serve.md`` has the table): ``--max-connections`` (more are refused
with a message), ``--max-seconds`` of audio per stream, ``--max-buffer-seconds`` of audio waiting
per stream (also the largest binary message), ``--max-messages-per-second`` per connection,
``--start-timeout`` and ``--idle-timeout``; ``--token`` (or ``$USMKIT_SERVE_TOKEN``): a shared
secret each WebSocket client (and ``/stats``) must send, as ``?token=...`` in the URL or an
``Authorization: Bearer ...`` header; ``--allowed-origins``: the web pages, besides the server's own,
whose scripts may open a socket; ``--allowed-hosts``: the names, besides its addresses and loopback
names, that a request's ``Host`` may give it (a page of another name resolved to the server, DNS
rebinding, is refused; ``access.host_ok``). Any error a client causes is sent to it as
``{"status": "failed", "message": ...}`` before its connection is closed; the others go on. SIGTERM
stops accepting, finishes the streams (their audio so far decoded, results sent) for at most
``--drain-seconds``, then exits. Binds to the loopback interface unless ``--host`` says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import socket
import time
from http import HTTPStatus
from importlib import resources
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from usmkit.errors import UsageError
from usmkit.serve.access import CHECKED_HEADERS, HeaderError, host_ok, one_header, origin_ok, token_ok
from usmkit.serve.batcher import Batcher
from usmkit.serve.client_socket import ClientSocket, close_discarding, peer_name
from usmkit.serve.config import ServeConfig
from usmkit.serve.connection import CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_LATER, Connection, Traffic
from usmkit.serve.protocol import MAX_SIGNAL_CHARS, failed
from usmkit.serve.session import Recognizer

log = logging.getLogger("usmkit.serve")

PAGE_FILES = {  # URL path -> (file under usmkit/serve/page, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/pcm-worklet.js": ("pcm-worklet.js", "text/javascript; charset=utf-8"),
    "/resampler.js": ("resampler.js", "text/javascript; charset=utf-8"),
}
QUEUED_FRAMES = (4, 1)  # websockets' read buffer per connection (high, low water), in frames of <= max_size
# The kernel's receive buffer per connection, fixed: left to autotuning it can grow to tcp_rmem's maximum
# (megabytes) for a client that sends faster than the server reads, memory the server's host holds for it.
# 256 KiB still carries 80 times real-time audio (32 KB/s) over a 100-ms round trip.
RECEIVE_BUFFER_BYTES = 256 * 1024


class Server:
    """The WebSocket server around a ``Recognizer``: ``async with Server(...) as s:`` listens on ``s.port``."""

    def __init__(self, recognizer: Recognizer, cfg: ServeConfig | None = None) -> None:
        cfg = cfg or ServeConfig()
        least = 2 * recognizer.round_samples / recognizer.sample_rate  # a stream must hold two rounds of audio
        if cfg.max_buffer_seconds < least:
            raise UsageError(
                f"--max-buffer-seconds {cfg.max_buffer_seconds:g} is too small for this model's chunks: a stream "
                f"must be able to hold two rounds of audio; use at least {least:.2f}"
            )
        self.recognizer = recognizer
        self.cfg = cfg
        self.batcher = Batcher(recognizer, cfg.max_batch)
        self.connections: set[Connection] = set()
        self.port: int | None = None
        self.draining = False
        self.traffic = Traffic()  # what all clients sent
        self._ws_server = None
        self._batcher_task: asyncio.Task | None = None

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_message_bytes(self) -> int:
        """The largest message: ``--max-buffer-seconds`` of 16-bit PCM (a signal is refused far below it)."""
        return max(2 * round(self.cfg.max_buffer_seconds * self.recognizer.sample_rate), 4 * MAX_SIGNAL_CHARS)

    async def start(self) -> None:
        self._batcher_task = asyncio.create_task(self.batcher.run())
        try:
            self._ws_server = await serve(
                self._handle,
                self.cfg.host,
                self.cfg.port,
                process_request=self._http,
                max_size=self.max_message_bytes,
                max_queue=QUEUED_FRAMES,  # a connection that is not read holds at most this many frames
                compression=None,  # PCM does not compress; deflating it costs both sides CPU
                create_connection=ClientSocket,
                ping_interval=self.cfg.ping_interval,
                ping_timeout=self.cfg.ping_timeout,
            )
        except OSError as e:
            self._batcher_task.cancel()
            raise UsageError(
                f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e.strerror or e}; pick another --port or --host"
            ) from e
        for sock in self._ws_server.sockets:  # accepted connections inherit it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self.port = self._ws_server.sockets[0].getsockname()[1]

    async def drain(self, seconds: float) -> None:
        """Stop accepting connections and finish the open streams: what each received is decoded and its
        results sent, then it is closed (1001). Waits at most ``seconds``; ``close`` ends what is left."""
        self.draining = True
        self._ws_server.close(close_connections=False)  # the listening socket only
        for conn in list(self.connections):
            conn.shutdown()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._ws_server.wait_closed()

    async def close(self) -> None:
        if self._ws_server is not None:
            self._ws_server.close()  # after a drain this is done already, and closes no connection
            left = [c.ws.close(CLOSE_GOING_AWAY, "the server is stopping") for c in list(self.connections)]
            if left:
                await asyncio.gather(*left, return_exceptions=True)
            await self._ws_server.wait_closed()
        if self._batcher_task is not None:
            self._batcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher_task
        await asyncio.get_running_loop().run_in_executor(None, self.batcher.close)

    def stats(self) -> dict:
        return {
            "connections": len(self.connections),
            "streams": self.batcher.streams,
            "messages_in": self.traffic.messages_in,
            "audio_in_s": round(self.traffic.samples_in / self.recognizer.sample_rate, 3),
            **self.batcher.stats.as_dict(),
        }

    # ------------------------------------------------------------------ HTTP: the page and /stats
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        refused = self._refused_request(connection, request)
        if refused is not None:
            return refused
        if (request.headers.get("Upgrade") or "").lower() == "websocket":
            if origin_ok(request.headers, self.cfg.allowed_origins):
                return None  # the WebSocket handshake goes on
            origin = request.headers.get("Origin")
            log.warning("refused a socket from the page %s (not in --allowed-origins)", origin)
            return _response(
                connection,
                HTTPStatus.FORBIDDEN,
                f"pages from {origin} may not open sockets to this server: add it to the server's --allowed-origins\n",
                "text/plain",
            )
        if request.method not in ("GET", "HEAD"):
            response = _response(
                connection, HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not served; use GET\n", "text/plain"
            )
            response.headers["Allow"] = "GET, HEAD"
            return response
        path = urlsplit(request.path).path
        if path == "/stats":
            if token_ok(self.cfg.token, request.path, request.headers):
                response = _response(connection, HTTPStatus.OK, json.dumps(self.stats()) + "\n", "application/json")
            else:
                response = _response(
                    connection,
                    HTTPStatus.UNAUTHORIZED,
                    "missing or wrong token: GET /stats?token=... (or send an Authorization: Bearer header)\n",
                    "text/plain",
                )
        elif path not in PAGE_FILES:
            response = _response(
                connection, HTTPStatus.NOT_FOUND, f"no page at {path}; the page is at /\n", "text/plain"
            )
        else:
            name, content_type = PAGE_FILES[path]
            response = _response(connection, HTTPStatus.OK, page_file(name), content_type)
        if request.method == "HEAD":  # the GET's headers, Content-Length included, and no body
            response = dataclasses.replace(response, body=b"")
        return response

    def _refused_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """400 for headers that cannot be judged (one named twice), 403 for a ``Host`` that does not name this
        server (``access.host_ok``); None for a request that may go on."""
        try:
            for name in CHECKED_HEADERS:
                one_header(request.headers, name)
        except HeaderError as e:
            log.warning("refused a request: %s", e)
            return _response(connection, HTTPStatus.BAD_REQUEST, f"{e}\n", "text/plain")
        host = one_header(request.headers, "Host")
        if host_ok(host, self.cfg.host, self.cfg.allowed_hosts):
            return None
        log.warning("refused a request for the host %r (not a name of this server, nor in --allowed-hosts)", host)
        return _response(
            connection,
            HTTPStatus.FORBIDDEN,
            f"{host!r} is not a name of this server: reach it by its address or a loopback name, or add the name "
            "to the server's --allowed-hosts\n",
            "text/plain",
        )

    # ------------------------------------------------------------------ WebSocket connections
    async def _handle(self, ws: ServerConnection) -> None:
        peer = peer_name(ws)
        if self.draining:
            await _refuse(ws, "the server is stopping; connect again later", CLOSE_GOING_AWAY)
            return
        if not token_ok(self.cfg.token, ws.request.path, ws.request.headers):
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
        conn = Connection(ws, peer, self.cfg, self.recognizer, self.batcher, self.traffic)
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


async def _refuse(ws: ServerConnection, message: str, code: int = CLOSE_POLICY) -> None:
    with contextlib.suppress(ConnectionClosed):
        await ws.send(failed(message))
        await close_discarding(ws, code, "refused")


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
    """Serve until SIGINT / SIGTERM, then drain (``Server.drain``, at most ``cfg.drain_seconds``; a second
    signal cuts it short); ``ready(line)`` gets the listening address once the port is bound."""
    loop = asyncio.get_running_loop()
    signals = asyncio.Queue()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, signals.put_nowait, sig)
    async with Server(recognizer, cfg) as server:
        ready(f"usmkit-serve: listening on ws://{cfg.host}:{server.port} (page: http://{cfg.host}:{server.port}/)")
        await signals.get()
        log.info(
            "stopping: finishing %d connections (at most %g s; a second signal stops at once)",
            len(server.connections),
            cfg.drain_seconds,
        )
        drain = asyncio.create_task(server.drain(cfg.drain_seconds))
        again = asyncio.create_task(signals.get())
        await asyncio.wait([drain, again], return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, again):
            task.cancel()
        if server.connections:
            log.info("closing %d connections that did not finish", len(server.connections))
