"""One client's recognition on the server: PCM in, events (partials, finals, the end) out.

Shapes: N samples, t feature frames (10 ms), C chunk size (encoder frames, 40 ms), F mel bins, D model dim.

A ``ServerStream`` is the command line's pipeline (``usmkit.streaming.pipeline.StreamingTranscriber``:
incremental features, the encoder's chunk buffer, CTC and the streaming decoder with its endpoints
and optional LAS rescoring) built without an encoder step of its own: the ``Batcher`` takes one
chunk from every stream that has one, runs them as one ``stream_step`` and hands each stream its
rows back (``encoded``). ``push`` / ``end`` / ``collect`` run on the event loop, the rest in the
batcher's worker thread.

``Recognizer`` holds what all streams share: the model, its feature statistics, the chunking, the
decoder settings (and the lexicon decoder of lexicon finals), and the batched encoder step: PyTorch's
(eager or traced) or an exported model's engine (``usmkit.export.engine``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from usmkit.data.config import FeatureConfig
from usmkit.data.normalize import FeatureStats
from usmkit.models.subsampling import feature_context
from usmkit.serve.protocol import PcmDecoder
from usmkit.streaming.decoder import DecoderConfig, Segment
from usmkit.streaming.features import StreamingFbank
from usmkit.streaming.pipeline import StreamingTranscriber
from usmkit.streaming.step import (
    EncoderStreamState,
    init_state,
    split_state,
    stack_states,
    stream_step,
)


@dataclass(frozen=True)
class Partial:
    """The open segment's n-best texts after a chunk; ``audio_ms``: the stream's audio (ms) up to the
    end of the message that completed the chunk."""

    texts: tuple[str, ...]
    audio_ms: int


@dataclass(frozen=True)
class Final:
    """A finalized segment (None: the stream ended with nothing new to say)."""

    segment: Segment | None
    audio_ms: int


@dataclass(frozen=True)
class End:
    """The stream is over: all of its audio is decoded (or, without continuous decoding, its first segment)."""

    audio_ms: int


Event = Partial | Final | End


class Recognizer:
    """The model and settings every stream of a server shares, and the encoder step for a batch of streams.

    ``model``: an ``AsrModel`` (a checkpoint's) or an ``ExportedModel`` (an export's: the encoder's config and
    the CTC head), with its ``tokenizer``, feature config and statistics. ``step``: ``"jit"`` (a traced
    graph that serves every batch size, ``TracedStreamStep(any_batch=True)``), ``"eager"``
    (``stream_step``), ``"graphs"`` (``stream_step`` replayed as one CUDA graph per batch size up to
    ``max_batch``, ``GraphedStreamStep``; ``bf16``: recorded under bf16 autocast), or an exported model's
    engine, called like ``stream_step``. ``chunk_size`` /
    ``left_chunks``: the mask streams run with. ``words``: a ``LexiconDecoder`` for lexicon finals (every
    stream's finals go through it, in the batcher's worker thread), or None.
    """

    def __init__(
        self,
        model,
        tokenizer,
        features: FeatureConfig,
        stats: FeatureStats,
        decoder_cfg: DecoderConfig,
        chunk_size: int,
        left_chunks: int,
        silence_db: float = -50.0,
        step="jit",
        words=None,
        max_batch: int = 32,
        bf16: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.features = features
        self.stats = stats
        self.decoder_cfg = decoder_cfg
        self.words = words
        self.chunk_size, self.left_chunks = chunk_size, left_chunks
        self.silence_db = silence_db
        self.device = next(self.model.parameters()).device
        # Computes the features of every stream's windows of a round at once, on the model's device (the framing is
        # each stream's own, on the CPU).
        self.fbank = StreamingFbank(self.features, self.stats).to(self.device)
        chunk_frames = self.model.encoder.subsampling_factor * chunk_size  # feature frames per chunk
        self.one_position = False  # whether the step takes one position for all its rows (``_run_by_position``)
        # The most audio one round featurizes for a stream: two chunks (and the first window).
        self.round_samples = 2 * chunk_frames * self.fbank.shift + self.fbank.window
        if step == "jit":
            from usmkit.streaming.traced_step import TracedStreamStep

            self.step = TracedStreamStep(self.model.encoder, any_batch=True)
        elif step == "eager":
            self.step = stream_step
        elif step == "graphs":
            from usmkit.streaming.graphed_step import GraphedStreamStep

            self.step = GraphedStreamStep(
                max_batch, capture=self.device.type == "cuda", precision="bf16" if bf16 else "fp32"
            )
        elif callable(step):
            self.step = step
            # An exported step takes one position (cache fill, offset) for its whole batch (docs/export.md).
            self.one_position = True
        else:
            raise ValueError(f"step must be 'jit', 'eager', 'graphs' or an engine, got {step!r}")

    @property
    def sample_rate(self) -> int:
        return self.features.sample_rate

    def warm_up(self) -> None:
        """Batched steps on zeros, so that tracing (or recording each batch size's CUDA graph) happens before the
        first client, not in its first chunk."""
        encoder = self.model.encoder
        F = encoder.cfg.input_dim
        context = feature_context(encoder.cfg.subsampling_factor, encoder.cfg.front_end)  # s - 1 (0 stacked)
        first = torch.zeros(1, context, F, device=self.device)  # (1, s - 1, F)
        state = init_state(encoder, first, self.chunk_size, self.left_chunks)
        chunk = torch.zeros(1, state.chunk_input_frames, F, device=self.device)  # (1, s C, F)
        length = torch.tensor([state.chunk_input_frames], device=self.device)
        for n in getattr(self.step, "sizes", [1]):
            self.run([chunk] * n, [length] * n, [state] * n)

    def run(
        self, chunks: list[torch.Tensor], lengths: list[torch.Tensor], states: list[EncoderStreamState]
    ) -> tuple[torch.Tensor, list[int], list[EncoderStreamState]]:
        """One step over the streams' next chunks (1, 4C, F) each -> out (B, C, D), valid frames per row, new states."""
        if self.one_position:
            return self._run_by_position(chunks, lengths, states)
        state = stack_states(states)
        with torch.no_grad():
            out, out_lens, new = self.step(self.model.encoder, torch.cat(chunks), state, torch.cat(lengths))
        return out, out_lens.tolist(), split_state(new)

    def _run_by_position(
        self, chunks: list[torch.Tensor], lengths: list[torch.Tensor], states: list[EncoderStreamState]
    ) -> tuple[torch.Tensor, list[int], list[EncoderStreamState]]:
        """``run`` for an exported step, whose cache fill and offset are one scalar for the whole batch: one
        call per group of streams at the same position (streams that started together share one call)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(states):
            groups.setdefault((int(s.cached.reshape(-1)[0]), int(s.offset.reshape(-1)[0])), []).append(i)
        outs: list[torch.Tensor | None] = [None] * len(states)
        frames: list[int] = [0] * len(states)
        new_states: list[EncoderStreamState | None] = [None] * len(states)
        for rows in groups.values():
            state = stack_states([states[i] for i in rows])
            state = replace(state, cached=state.cached[0], offset=state.offset[0])  # () each
            with torch.no_grad():
                out, out_lens, new = self.step(
                    self.model.encoder,
                    torch.cat([chunks[i] for i in rows]),
                    state,
                    torch.cat([lengths[i] for i in rows]),
                )  # (b, C, D), (b,)
            for j, (i, row_state) in enumerate(zip(rows, split_state(new), strict=True)):
                outs[i], frames[i], new_states[i] = out[j : j + 1], int(out_lens[j]), row_state
        return torch.cat(outs), frames, new_states

    def featurize(self, windows: list[torch.Tensor]) -> list[torch.Tensor]:
        """The streams' raw feature windows (t_i, L) each -> their normalized frames (1, t_i, F) on the model's device:
        one copy to the device and one feature computation there for all of them (per stream, the fixed cost of
        each small computation and copy would be most of the time)."""
        counts = [w.shape[0] for w in windows]
        frames = self.fbank.frames(torch.cat(windows).to(self.device))  # (sum t_i, F)
        return [f[None] for f in frames.split(counts)]

    def log_probs(self, out: torch.Tensor) -> torch.Tensor:
        """The CTC head over a step's rows at once: out (B, C, D) -> log-probs (B, C, V), fp32 on the CPU, in one
        transfer (per stream, each row's head and copy would cost a device round trip on a GPU)."""
        with torch.no_grad():
            return self.model.ctc(out).float().cpu()

    def new_stream(self, nbest: int = 1, continuous: bool = False) -> ServerStream:
        return ServerStream(self, nbest, continuous)


@dataclass
class _Inbox:
    """What the event loop hands a stream for one round: the raw PCM bytes queued since its last turn (up to
    a cap) and whether the end came after them."""

    pcm: bytes = b""
    ended: bool = False


class ServerStream:
    """One client's recognition. ``push`` / ``end`` (event loop) queue audio; before each round the batcher
    ``collect``s it, and its worker calls ``take`` (features), ``next_chunk`` -> one batched step ->
    ``encoded`` (decoding), and ``wrap_up``.

    The audio waits as raw bytes in one buffer, however many messages brought it, and the stream asks
    for a round (``push`` returns True) only once a whole chunk of audio is there; each round's ``take``
    decodes and featurizes what was collected in one call, so the cost follows the audio, not the
    number of messages. A round collects at most ``round_samples`` (two chunks of audio), and none
    while the encoder already has two chunks waiting: a stream that sends ahead of real time gets one
    chunk per round like the others, and its features are computed as the encoder needs them.
    ``buffered_samples`` (audio received but not yet encoded) is what the server bounds per stream.

    ``nbest``: texts per result (more than one only with ``ctc_beam``). ``continuous``: keep decoding
    after the first endpoint (WeNet's ``continuous_decoding``); otherwise the stream ends there.
    """

    def __init__(self, recognizer: Recognizer, nbest: int = 1, continuous: bool = False) -> None:
        r = recognizer
        self.recognizer = recognizer
        self.nbest = nbest
        self.continuous = continuous
        self.transcriber = StreamingTranscriber(
            r.model,
            r.tokenizer,
            StreamingFbank(r.features, r.stats),
            r.decoder_cfg,
            r.chunk_size,
            r.left_chunks,
            silence_db=r.silence_db,
            step=None,
            words=r.words,
        )
        fbank = self.transcriber.fbank
        self.sample_rate = r.sample_rate
        self.round_samples = r.round_samples
        self._window, self._shift = fbank.window, fbank.shift
        self._context = self.encoder.feature_context  # s - 1 feature frames start the encoder's state
        self._chunk_frames = self.encoder.encoder.subsampling_factor * r.chunk_size  # s C feature frames a chunk
        # event loop side
        self._queued = bytearray()  # PCM bytes not yet collected
        self._end_queued = False  # the end came (after the queued bytes)
        self._end_collected = False
        self.bytes_in = 0  # PCM bytes pushed
        self._chunks_announced = 0  # whole chunks of audio that ``push`` has reported
        # Sample positions where messages ended (at least one feature hop apart), for ``audio_ms``;
        # appended by the loop, consumed by the worker (a deque's append and popleft are thread-safe).
        self._message_ends: deque[int] = deque()
        self.opened = time.monotonic()
        # worker side
        self.last_round = -1  # the batcher's round that last encoded a chunk of it
        self.done = False  # End was emitted
        self.failed = False  # the batcher gave up on it (an Error was emitted)
        self.samples_done = 0  # samples whose features the encoder has consumed (read by the loop)
        self._pcm = PcmDecoder()
        self._samples_fed = 0
        self._end_fed = False
        self._tail_taken = False
        self._frames_encoded = 0  # feature frames the encoder has consumed (s - 1 + s C per whole chunk)

    # ------------------------------------------------------------------ event loop side
    @property
    def samples_in(self) -> int:
        """Samples received (a trailing odd byte waits for its partner)."""
        return self.bytes_in // 2

    @property
    def buffered_samples(self) -> int:
        """Samples received but not yet through the encoder."""
        return self.samples_in - self.samples_done

    def push(self, pcm: bytes) -> bool:
        """Queue one message's 16-bit little-endian PCM bytes (any number, a sample may be split). True when
        they complete a chunk: only then does the stream need a round (between chunks nothing is decided)."""
        self._queued += pcm
        self.bytes_in += len(pcm)
        end = self.samples_in
        if not self._message_ends or end - self._message_ends[-1] >= self._shift:
            self._message_ends.append(end)
        chunks = (self._frames_after(end) - self._context) // self._chunk_frames
        if chunks <= self._chunks_announced:
            return False
        self._chunks_announced = chunks
        return True

    def end(self) -> None:
        """No more audio will come."""
        self._end_queued = True

    def collect(self) -> _Inbox:
        """Hand over the audio for the next round (event loop, while the worker is idle)."""
        n = 0 if self.encoder.chunks_ready >= 2 else min(len(self._queued), 2 * self.round_samples)
        pcm = bytes(self._queued[:n])
        del self._queued[:n]
        ended = self._end_queued and not self._queued and not self._end_collected
        self._end_collected |= ended
        return _Inbox(pcm, ended)

    @property
    def has_work(self) -> bool:
        """Whether the next round has something to do for this stream without new messages: a chunk to
        encode, one whose audio is still queued, or the end (audio short of a chunk waits for more)."""
        if self.done or self.failed:
            return False
        ready = self.encoder.chunks_ready
        end_waiting = self._end_queued and not self._end_collected
        return bool(ready) or self.encoder.chunks + ready < self._chunks_announced or self._end_fed or end_waiting

    def ahead_s(self, now: float) -> float:
        """How far (s) the audio received runs ahead of the clock since the stream started: at most about 0
        for a live source (whether or not the server keeps up with it), more for a client sending recorded
        audio faster than real time."""
        return self.samples_in / self.sample_rate - (now - self.opened)

    # ------------------------------------------------------------------ worker side
    @property
    def encoder(self):
        return self.transcriber.encoder

    @property
    def has_chunk(self) -> bool:
        """Whether ``next_chunk`` has one to give now (a whole one, or at the end the tail)."""
        if self.done or self.failed:
            return False
        return bool(self.encoder.chunks_ready) or (self._end_fed and not self._tail_taken)

    def take(self, inbox: _Inbox) -> None:
        """Features of the collected audio into the encoder's buffer: one feed for all of it."""
        self.take_frames(self.recognizer.featurize([self.windows(inbox)])[0], inbox.ended)

    def windows(self, inbox: _Inbox) -> torch.Tensor:
        """``take``'s first half: the collected audio decoded, its levels noted, and the raw windows (t, L) of the
        feature frames it completes (the batcher computes every stream's at once: ``Recognizer.featurize``)."""
        samples = self._pcm(inbox.pcm)  # (N,)
        if not samples.size:
            return self.transcriber.fbank.accept_windows(samples)  # (0, L)
        self._samples_fed += samples.size
        return self.transcriber.feed_windows(samples)

    def take_frames(self, frames: torch.Tensor, ended: bool) -> None:
        """``take``'s second half: the frames (1, t, F) of ``windows`` into the encoder's buffer, then, if the inbox
        held the end (``ended``), the last frames."""
        t = self.transcriber
        if frames.shape[1]:
            t.encoder.queue(frames)
        if ended and not self._end_fed:
            t.encoder.queue(t.feed_end())
            self._end_fed = True

    def next_chunk(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The next chunk to encode, (1, 4C, F) and its lengths (1,): a whole one, or at the end the padded
        tail; None when there is none now."""
        if self.done or self.failed:
            return None
        if self.encoder.chunks_ready:
            return self.encoder.next_chunk()
        if self._end_fed and not self._tail_taken:
            self._tail_taken = True
            return self.encoder.last_chunk()
        return None

    @property
    def state(self) -> EncoderStreamState:
        return self.encoder.state

    def encoded(
        self, out: torch.Tensor, frames: int, state: EncoderStreamState, log_probs: torch.Tensor | None = None
    ) -> list[Event]:
        """The batched step's row for this stream's chunk: out (1, C, D), its valid frames, the new state, and
        the row's CTC log-probs (C, V) if the caller computed them for the batch (``Recognizer.log_probs``)."""
        enc = self.encoder.advance(out, state, frames)  # (1, n, D)
        self._frames_encoded = self.encoder.feature_context + self.encoder.chunks * state.chunk_input_frames
        self.samples_done = min(self._samples_fed, self._frames_encoded * self._shift)
        audio_ms = self._audio_ms()
        events: list[Event] = []
        lp = log_probs[: enc.shape[1]] if log_probs is not None else None  # (n, V)
        for segment in self.transcriber.frames.decode(enc[0], lp):
            events += self._final(segment, audio_ms)
            if self.done:
                return events
        texts = self.transcriber.frames.decoder.partial_nbest(self.nbest)
        if texts and texts[0]:
            events.append(Partial(tuple(texts), audio_ms))
        return events

    def wrap_up(self) -> list[Event]:
        """After a round: at the end of the audio, once every chunk is encoded, the last segment and the End."""
        if self.done or not (self._end_fed and self._tail_taken) or self.encoder.chunks_ready:
            return []
        audio_ms = round(1000 * self._samples_fed / self.sample_rate)
        events: list[Event] = []
        for segment in self.transcriber.frames.finish():
            events += self._final(segment, audio_ms)
            if self.done:
                return events
        self.done = True
        if not events:  # WeNet's clients expect a final result before the end, even an empty one
            events.append(Final(None, audio_ms))
        return [*events, End(audio_ms)]

    def _final(self, segment: Segment, audio_ms: int) -> list[Event]:
        if self.continuous:
            return [Final(segment, audio_ms)]
        self.done = True
        return [Final(segment, audio_ms), End(audio_ms)]

    def _frames_after(self, samples: int) -> int:
        """Feature frames ``StreamingFbank`` has produced once it has ``samples``: frame k's window, after
        the start reflection of (window - hop) / 2 samples, ends at sample k hop + window - (window - hop) / 2."""
        ahead = samples + (self._window - self._shift) // 2 - self._window
        return 0 if samples < self._window else ahead // self._shift + 1

    def _audio_ms(self) -> int:
        """The stream's audio (ms) at the end of the message that completed the frames encoded so far."""
        ends = self._message_ends
        while len(ends) > 1 and self._frames_after(ends[0]) < self._frames_encoded:
            ends.popleft()
        samples = ends[0] if ends else self._samples_fed
        return round(1000 * samples / self.sample_rate)
