"""Rounds of batched encoder steps: the chunks of every stream that has one run as one ``stream_step``.

The event loop never runs the model. ``Batcher.run`` (a task on the loop) waits until some stream
has news (audio that completes a chunk, the end), hands each such stream what it queued, and runs a
*round* in one worker thread: features of the new audio (each stream cuts its own feature windows;
one computation on the model's device makes the frames of all of them); one chunk from every stream
that has a chunk ready, their states stacked along the batch axis
(``usmkit.streaming.step.stack_states``) into batches of at most ``max_batch`` rows, one step per
batch, the CTC head over the whole batch with one copy to the host, each row's output, state and
log-probs given back to its stream, which decodes them; then the end of streams whose audio ended.
The events go back to each stream's sink on the loop (every stream of the round gets a call, with no
events if it has none: the server learns there that the stream's buffer has room again). Audio keeps
arriving while a round runs, and what is ready when it ends forms the next round, so batches grow
with the load.

A stream with more chunks buffered gives one per round, and has its audio featurized only as its
chunks are needed (``ServerStream.collect``). Streams whose audio came more than ``AHEAD_S`` ahead of
the clock (clients sending recordings faster than real time) come second (``choose``): while any
stream at real time is attached, a round takes at most ``BACKLOG_ROWS`` of their chunks, the least
recently served first, and rounds of their chunks alone take at most ``BACKLOG_SHARE`` of the
worker's time (after one, the next waits as long again unless a live stream's chunk comes), so the
next real-time chunk mostly finds the worker free; with no real-time stream attached they batch like
any other.

A failure inside one stream (its features, its decoding) ends that stream with an ``Error`` event;
a failed step fails the streams of that batch. The server goes on with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from usmkit.serve.session import Event, Recognizer, ServerStream

log = logging.getLogger("usmkit.serve")


@dataclass(frozen=True)
class Error:
    """The stream failed on the server; ``message`` says what happened."""

    message: str


Sink = Callable[[list[Event | Error]], None]

AHEAD_S = 1.0  # a stream whose audio came further ahead of the clock than this is not a live source
BACKLOG_ROWS = 1  # chunks of such streams per round while a real-time stream is attached
BACKLOG_SHARE = 0.5  # of the worker's time, at most, for rounds of such chunks alone meanwhile


def choose(ready: list[ServerStream], now: float, real_time_attached: bool) -> list[ServerStream]:
    """The streams (of those with a chunk ``ready``) whose chunk runs this round: all of them, unless a
    real-time stream is attached; then every stream not ``AHEAD_S`` ahead of the clock and at most
    ``BACKLOG_ROWS`` of those ahead, the least recently served first."""
    if not real_time_attached:
        return ready
    live = [s for s in ready if s.ahead_s(now) <= AHEAD_S]
    ahead = sorted((s for s in ready if s.ahead_s(now) > AHEAD_S), key=lambda s: s.last_round)
    return live + ahead[:BACKLOG_ROWS]


@dataclass
class BatchStats:
    """Counters of the rounds so far (served at ``/stats``)."""

    rounds: int = 0
    steps: int = 0  # batched encoder steps
    chunks: int = 0  # stream chunks encoded (rows of the steps)
    max_batch: int = 0
    busy_s: float = 0.0  # time the worker spent in rounds

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "steps": self.steps,
            "chunks": self.chunks,
            "mean_batch": round(self.chunks / self.steps, 2) if self.steps else 0.0,
            "max_batch": self.max_batch,
            "busy_s": round(self.busy_s, 3),
        }


class Batcher:
    """Runs the streams' chunks in batched rounds on one worker thread; ``run`` is its task on the event loop."""

    def __init__(self, recognizer: Recognizer, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.recognizer = recognizer
        self.max_batch = max_batch
        self.stats = BatchStats()
        self._sinks: dict[ServerStream, Sink] = {}
        self._dirty: dict[ServerStream, None] = {}  # an ordered set: streams with news, in arrival order
        self._wake = asyncio.Event()
        self._live_news = asyncio.Event()  # a stream at real time has news
        self._rest_until = 0.0  # (loop time) no round of backlog chunks alone before this
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usmkit-serve-model")

    @property
    def streams(self) -> int:
        """Streams attached now."""
        return len(self._sinks)

    # ------------------------------------------------------------------ event loop side
    def add(self, stream: ServerStream, sink: Sink) -> None:
        self._sinks[stream] = sink

    def remove(self, stream: ServerStream) -> None:
        """Forget a stream (its client left or it ended); a round running now drops its events."""
        self._sinks.pop(stream, None)
        self._dirty.pop(stream, None)

    def notify(self, stream: ServerStream) -> None:
        """The stream has news (audio or its end) for the next round."""
        if stream in self._sinks:
            self._dirty[stream] = None
            self._wake.set()
            if stream.ahead_s(time.monotonic()) <= AHEAD_S:
                self._live_news.set()

    async def run(self) -> None:
        """Rounds for as long as the server runs (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            rest = self._rest_until - loop.time()
            if rest > 0 and not self._live_news.is_set():  # only backlog news: the worker rests first
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(rest):
                        await self._live_news.wait()
            self._live_news.clear()
            await self._next_round()  # its own frame: no stream outlives its round in a local variable here

    async def _next_round(self) -> None:
        work = [(stream, stream.collect()) for stream in self._dirty if stream in self._sinks]
        self._dirty.clear()
        if not work:
            return
        now = time.monotonic()
        real_time = any(not s.done and s.ahead_s(now) <= AHEAD_S for s in self._sinks)
        loop = asyncio.get_running_loop()
        start = loop.time()
        results, backlog_only = await loop.run_in_executor(self._pool, self._round, work, real_time)
        if backlog_only:
            self._rest_until = loop.time() + (loop.time() - start) * (1 - BACKLOG_SHARE) / BACKLOG_SHARE
        for stream, events in results:
            sink = self._sinks.get(stream)
            if sink is None:  # the client left during the round: its events go nowhere
                continue
            sink(events)
            if stream.has_work:
                self.notify(stream)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ worker side
    def _round(
        self, work: list[tuple[ServerStream, object]], real_time_attached: bool
    ) -> tuple[list[tuple[ServerStream, list[Event | Error]]], bool]:
        """Features, steps and decoding of the streams in ``work``; their events, and whether the round ran
        only chunks of streams ahead of real time while a real-time stream was attached."""
        start = time.perf_counter()
        events: dict[ServerStream, list[Event | Error]] = {stream: [] for stream, _ in work}
        with torch.no_grad():
            ready = [stream for stream in self._take(work, events) if stream.has_chunk]
            rows = []  # (stream, (chunk (1, 4C, F), lengths (1,)))
            now = time.monotonic()
            chosen = choose(ready, now, real_time_attached)
            backlog_only = real_time_attached and bool(chosen) and all(s.ahead_s(now) > AHEAD_S for s in chosen)
            for stream in chosen:
                try:
                    taken = stream.next_chunk()
                except Exception as e:  # noqa: BLE001
                    self._fail(stream, events, e)
                    continue
                if taken is not None:
                    stream.last_round = self.stats.rounds
                    rows.append((stream, taken))
            for i in range(0, len(rows), self.max_batch):
                self._step(rows[i : i + self.max_batch], events)
            for stream, _ in work:
                if stream.failed:
                    continue
                try:
                    events[stream] += stream.wrap_up()
                except Exception as e:  # noqa: BLE001
                    self._fail(stream, events, e)
        self.stats.rounds += 1
        self.stats.busy_s += time.perf_counter() - start
        return list(events.items()), backlog_only

    def _take(self, work: list[tuple[ServerStream, object]], events: dict) -> list[ServerStream]:
        """Each stream's collected audio into its encoder's buffer, the features of all of them computed at once;
        the streams that did not fail."""
        windowed = []  # (stream, its inbox, raw feature windows (t, L))
        for stream, inbox in work:
            try:
                windowed.append((stream, inbox, stream.windows(inbox)))
            except Exception as e:  # noqa: BLE001 - one stream's failure must not take the others down
                self._fail(stream, events, e)
        try:
            frames = self.recognizer.featurize([w for _, _, w in windowed])
        except Exception as e:  # noqa: BLE001 - the features of one stream's windows cannot fail alone
            for stream, _, _ in windowed:
                self._fail(stream, events, e, what="the features")
            return []
        taken = []
        for (stream, inbox, _), f in zip(windowed, frames, strict=True):
            try:
                stream.take_frames(f, inbox.ended)
            except Exception as e:  # noqa: BLE001
                self._fail(stream, events, e)
                continue
            taken.append(stream)
        return taken

    def _step(self, rows: list, events: dict[ServerStream, list[Event | Error]]) -> None:
        """One batched encoder step over rows [(stream, (chunk, lengths))], then each row's decoding."""
        try:
            out, frames, states = self.recognizer.run(
                [chunk for _, (chunk, _) in rows], [lengths for _, (_, lengths) in rows], [s.state for s, _ in rows]
            )  # out (B, C, D)
        except Exception as e:  # noqa: BLE001 - the streams of this batch fail; the server goes on
            for stream, _ in rows:
                self._fail(stream, events, e, what="the encoder step")
            return
        self.stats.steps += 1
        self.stats.chunks += len(rows)
        self.stats.max_batch = max(self.stats.max_batch, len(rows))
        try:
            log_probs = self.recognizer.log_probs(out)  # (B, C, V) on the CPU: one head and one copy per step
        except Exception as e:  # noqa: BLE001
            for stream, _ in rows:
                self._fail(stream, events, e, what="the CTC head")
            return
        for b, (stream, _) in enumerate(rows):
            try:
                events[stream] += stream.encoded(out[b : b + 1], frames[b], states[b], log_probs[b])
            except Exception as e:  # noqa: BLE001
                self._fail(stream, events, e)

    @staticmethod
    def _fail(stream: ServerStream, events: dict, e: Exception, what: str = "recognition") -> None:
        log.error("%s failed for a stream: %s: %s", what, type(e).__name__, e, exc_info=e)
        stream.failed = True
        events[stream].append(Error(f"{what} failed on the server: {type(e).__name__}: {e}"))
