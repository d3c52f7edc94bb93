"""One client of ``usmkit-serve``: reads its messages, feeds its stream, writes its results in order.

A connection reads one message at a time and stops reading (so TCP slows the client down) while

- its stream holds ``--max-buffer-seconds`` of audio not yet through the encoder (a client sending
  faster than the server decodes waits for it instead of filling the server's memory), or
- it is ahead of ``--max-messages-per-second`` (``access.MessageRate``): every message costs the event
  loop the same, whatever its size, so a client of tiny messages cannot take the loop from others.

A paced client's answer to the keepalive ping waits behind its audio; its socket
(``client_socket.ClientSocket``) counts the audio arriving meanwhile as the answer, so pacing never
costs a client its connection or its final results.

A connection that sends no start signal within ``--start-timeout`` seconds is closed with a message; a
started stream that gets no message for ``--idle-timeout`` seconds is ended as if its end signal had
come: its audio is decoded, its results sent, then the message saying why. Shutting the server down
ends every stream the same way (``shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from usmkit.serve.access import MessageRate
from usmkit.serve.batcher import Batcher, Error
from usmkit.serve.client_socket import while_discarding
from usmkit.serve.config import ServeConfig
from usmkit.serve.protocol import (
    EndSignal,
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

CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_ERROR, CLOSE_TRY_LATER = 1000, 1001, 1008, 1011, 1013
# A connection over its message rate pauses once its debt reaches this: one timer per 20 ms instead of one
# per message keeps the pacing itself cheap (the rate is the same on average).
RATE_PAUSE_S = 0.02


@dataclass
class Traffic:
    """What all the server's clients sent: the ``/stats`` counters every connection adds to."""

    messages_in: int = 0  # messages read
    samples_in: int = 0  # audio samples received


class Connection:
    """One client: its messages in (``run``), its stream's results out through an outbox, in order. Its
    stream is decoded by ``batcher`` with ``recognizer``'s model; ``traffic`` counts what it reads."""

    def __init__(
        self,
        ws: ServerConnection,
        peer: str,
        cfg: ServeConfig,
        recognizer: Recognizer,
        batcher: Batcher,
        traffic: Traffic,
    ) -> None:
        self.cfg = cfg
        self.recognizer = recognizer
        self.batcher = batcher
        self.traffic = traffic
        self.ws = ws
        self.peer = peer
        self.stream: ServerStream | None = None
        self.start: Start | None = None
        self.ended = False  # no more audio is taken: the end signal came, or the server ended the stream
        self.cut: tuple[str, int] | None = None  # (message, close code) when the server ended the stream
        self.outcome = "client left"  # for the log
        self.buffer_limit = round(self.cfg.max_buffer_seconds * recognizer.sample_rate)  # samples
        self._rate = MessageRate(self.cfg.max_messages_per_second)
        self._room = asyncio.Event()  # set after each round of the stream: its buffer may have room again
        self._outbox: asyncio.Queue[str | tuple[int, str]] = asyncio.Queue()
        self._closing = False
        self._audio_s = 0.0

    @property
    def audio_s(self) -> float:
        """Audio received (s)."""
        if self.stream is not None:
            self._audio_s = self.stream.samples_in / self.stream.sample_rate
        return self._audio_s

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        loop = asyncio.get_running_loop()
        start_deadline = loop.time() + self.cfg.start_timeout
        try:
            while not self._closing:
                await self._room_for_audio()
                if self._closing:
                    break
                try:
                    async with asyncio.timeout(self._timeout(start_deadline - loop.time())):
                        message = await self.ws.recv()
                except TimeoutError:
                    self._timed_out()
                    continue
                if self._closing:
                    break
                pause = self._rate.wait(loop.time())
                self.traffic.messages_in += 1
                try:
                    if isinstance(message, str):
                        self._on_text(message)
                    else:
                        self._on_audio(message)
                except ProtocolError as e:
                    self.fail(str(e), CLOSE_POLICY)
                except Exception as e:  # noqa: BLE001 - the client hears of it; the server goes on
                    log.exception("%s: a message failed", self.peer)
                    self.fail(f"the server failed on a message: {type(e).__name__}: {e}", CLOSE_ERROR)
                if pause >= RATE_PAUSE_S:
                    await asyncio.sleep(pause)
        except ConnectionClosed:
            pass  # the client vanished mid-stream
        finally:
            if self._closing:
                await while_discarding(self.ws, writer)  # what is queued, then the close
            else:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    def _timeout(self, until_start: float) -> float | None:
        """How long the next message may take: until the start deadline, then ``--idle-timeout`` per message
        while audio is expected, then no limit (the results of an ended stream are on their way)."""
        if self.start is None:
            return max(until_start, 0.0)
        return None if self.ended else self.cfg.idle_timeout

    def _timed_out(self) -> None:
        if self.start is None:
            self.fail(
                f"no start signal within {self.cfg.start_timeout:g} s (--start-timeout): send "
                '{"signal": "start"} right after connecting, then the audio',
                CLOSE_POLICY,
            )
        else:
            self.cut_stream(
                f"no audio for {self.cfg.idle_timeout:g} s (--idle-timeout): the results above cover the audio "
                'received; send {"signal": "end"} when the audio ends, and start a new stream for more',
                CLOSE_POLICY,
            )

    async def _room_for_audio(self) -> None:
        """Wait while the stream holds ``--max-buffer-seconds`` of audio not yet encoded."""
        while (
            self.stream is not None
            and not (self.ended or self._closing)
            and self.stream.buffered_samples >= self.buffer_limit
        ):
            self._room.clear()
            await self._room.wait()

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
        self._room.set()
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

    def cut_stream(self, message: str, code: int) -> None:
        """End the stream for the client: its audio so far is decoded and its results sent, then ``message``
        as a failure and the close. Audio that comes after is dropped."""
        if self._closing or self.ended or self.stream is None:
            return
        self.cut = (message, code)
        self.ended = True
        self._room.set()
        self.stream.end()
        self.batcher.notify(self.stream)

    def shutdown(self) -> None:
        """The server is stopping: finish what was received, then close (1001, going away)."""
        if self.start is None:
            self.fail("the server is stopping; connect again later", CLOSE_GOING_AWAY)
        else:
            self.cut_stream(
                "the server is stopping: the results above cover the audio it received; connect again later "
                "for the rest",
                CLOSE_GOING_AWAY,
            )

    def release(self) -> None:
        """Detach the stream from the batcher (its state is dropped with it)."""
        if self.stream is not None:
            self._audio_s = self.audio_s
            self.batcher.remove(self.stream)
            self.stream = None

    # ------------------------------------------------------------------ client messages
    def _on_text(self, text: str) -> None:
        signal_ = parse_signal(text)
        if isinstance(signal_, Start):
            if self.start is not None:
                raise ProtocolError('the stream has already started: send audio, then {"signal": "end"}')
            self.start = signal_
            self.stream = self.recognizer.new_stream(signal_.nbest, signal_.continuous_decoding)
            self.batcher.add(self.stream, self.deliver)
            self._outbox.put_nowait(server_ready())
            return
        assert isinstance(signal_, EndSignal)
        if self.start is None:
            raise ProtocolError('end signal before the start signal: send {"signal": "start"} first')
        if self.cut is not None:
            return  # the server already ended the stream; its message follows its last results
        if self.ended:
            raise ProtocolError("the end signal came twice")
        self.ended = True
        self.stream.end()
        self.batcher.notify(self.stream)

    def _on_audio(self, data: bytes) -> None:
        if self.start is None:
            raise ProtocolError('audio before the start signal: send {"signal": "start"} first, then binary PCM')
        if self.cut is not None:
            return  # past a limit, a timeout or the shutdown: dropped; the stream is being finished
        if self.ended:
            raise ProtocolError("audio after the end signal")
        room = 2 * round(self.cfg.max_seconds * self.stream.sample_rate) - self.stream.bytes_in  # bytes
        over = len(data) > room
        if over:
            data = data[: max(room, 0)]
        if data:
            before = self.stream.samples_in
            if self.stream.push(data):
                self.batcher.notify(self.stream)
            self.traffic.samples_in += self.stream.samples_in - before
        if over:
            self.cut_stream(
                f"the stream reached the server's limit of {self.cfg.max_seconds:g} s of audio "
                "(--max-seconds): the results above cover the audio up to it, the rest was dropped; "
                "start a new stream for more",
                CLOSE_POLICY,
            )

    # ------------------------------------------------------------------ results (from the batcher)
    def deliver(self, events: list) -> None:
        """A round's events for the stream (none, when it only moved its audio along)."""
        self._room.set()
        for event in events:
            if self._closing:
                return
            if isinstance(event, Partial):
                self._outbox.put_nowait(partial_result(event.texts, event.audio_ms))
            elif isinstance(event, Final):
                self._outbox.put_nowait(final_result(event.segment, self.start.nbest, event.audio_ms))
            elif isinstance(event, End):
                if self.cut is not None:
                    self.fail(*self.cut)
                else:
                    self.outcome = "done"
                    self._outbox.put_nowait(speech_end())
                    self._close(CLOSE_NORMAL)
            elif isinstance(event, Error):
                self.fail(event.message, CLOSE_ERROR)
