"""The server's end of one WebSocket: websockets' ``ServerConnection`` with the two changes the server needs.

- **Every close the client causes is explained.** The WebSocket layer closes some connections on its own:
  1002 (a frame that breaks the protocol), 1007 (a text message that is not UTF-8), 1009 (a message over the
  size limit). ``ClientSocket`` sends the protocol's ``{"status": "failed", "message": ...}`` first, as the
  server does before each close of its own. websockets has no hook for a message before its own close, so
  the socket wraps its protocol's ``fail``, where those closes are made.
- **The keepalive survives throttling.** The server stops reading a client that sends faster than it is
  allowed (``--max-messages-per-second``, ``--max-buffer-seconds``): TCP then slows the client down. The
  client's answer to a keepalive ping waits in the socket behind the audio it sent before, so websockets'
  keepalive would close a client that is only being paced (1011, "keepalive ping timeout"). Here a client is
  alive when its pong arrives, when data arrived from it after the ping, or while the server is not reading
  it (websockets' flow control has paused the transport); only a client silent on all three is closed.

``discard_messages`` reads and drops what a client still sends, so that a close the server starts is
answered at once even when the client's close frame queues behind audio nobody will read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.protocol import State

from usmkit.serve.protocol import MAX_SIGNAL_CHARS, failed

log = logging.getLogger("usmkit.serve")


def layer_close_message(code: int, reason: str, max_bytes: int | None) -> str | None:
    """What the client is told before the WebSocket layer closes its connection with ``code`` (None: a close
    the server explains itself, or one after which nothing can be sent)."""
    if code == CloseCode.PROTOCOL_ERROR:
        return f"a frame that breaks the WebSocket protocol ({reason}); use a WebSocket client library"
    if code == CloseCode.INVALID_DATA:
        return (
            f"a text message that is not UTF-8 ({reason}): text messages are JSON signals, "
            '{"signal": "start"} or {"signal": "end"}; audio goes in binary messages'
        )
    if code == CloseCode.MESSAGE_TOO_BIG:
        return (
            f"a message over the server's limit of {max_bytes} bytes: text messages are signals of at "
            f"most {MAX_SIGNAL_CHARS} characters, binary messages at most --max-buffer-seconds of 16-bit PCM; "
            "send the audio in smaller messages"
        )
    return None


class ClientSocket(ServerConnection):
    """A ``ServerConnection`` that explains the WebSocket layer's closes and keeps a paced client alive."""

    def __init__(self, protocol, *args, **kwargs) -> None:
        super().__init__(protocol, *args, **kwargs)
        self._data_at = -math.inf  # loop time of the last bytes received
        close = protocol.fail

        def explained_fail(code: int, reason: str = "") -> None:
            message = layer_close_message(code, reason, protocol.max_message_size)
            if message is not None and protocol.state is State.OPEN and protocol.close_sent is None:
                log.warning("%s: %s", peer_name(self), message)
                protocol.send_text(failed(message).encode())
            close(code, reason)

        protocol.fail = explained_fail

    def data_received(self, data: bytes) -> None:
        self._data_at = self.loop.time()
        super().data_received(data)

    def _alive_since(self, sent: float) -> bool:
        """Whether the client showed it is there since ``sent`` without its pong: data arrived, or the server is
        not reading it (its pong is queued behind its data)."""
        return self._data_at > sent or self.recv_messages.paused

    async def keepalive(self) -> None:
        """A ping every ``ping_interval``; a client neither answering within ``ping_timeout`` nor alive by its
        data (``_alive_since``) is closed (1011), as websockets' own keepalive does."""
        assert self.ping_interval is not None
        try:
            while True:
                await asyncio.sleep(self.ping_interval)
                sent = self.loop.time()
                pong = await self.ping()
                pong.add_done_callback(lambda f: f.cancelled() or f.exception())  # a late pong is not waited on
                if self.ping_timeout is None:
                    continue
                done, _ = await asyncio.wait({pong}, timeout=self.ping_timeout)
                if done or self._alive_since(sent):
                    continue
                async with self.send_context():
                    self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                return
        except ConnectionClosed:
            pass


def peer_name(ws: ServerConnection) -> str:
    """``host:port`` of the client (for logs)."""
    address = ws.remote_address
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


async def discard_messages(ws: ServerConnection) -> None:
    """Read and drop the client's messages until the connection closes (nothing else may read it meanwhile)."""
    with contextlib.suppress(ConnectionClosed):
        while True:
            await ws.recv(decode=False)


async def while_discarding(ws: ServerConnection, awaitable: Awaitable[object]) -> None:
    """Await ``awaitable`` (a close, or a writer that ends in one) while reading and dropping what the client
    still sends: its close frame is read at once, not after the audio it queued (which websockets stops
    reading when nobody takes it)."""
    reader = asyncio.create_task(discard_messages(ws))
    try:
        with contextlib.suppress(ConnectionClosed):
            await awaitable
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def close_discarding(ws: ServerConnection, code: int, reason: str = "") -> None:
    """``ws.close(code, reason)`` while dropping the client's messages (``while_discarding``)."""
    await while_discarding(ws, ws.close(code, reason))
