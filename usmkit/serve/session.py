"""One client's recognition on the server: PCM in, events (partials, finals, the end) out.

Shapes: N samples, t feature frames (10 ms), C chunk size (encoder frames, 40 ms), F mel bins, D model dim.

A ``ServerStream`` is the command line's pipeline (``usmkit.streaming.pipeline.StreamingTranscriber``:
incremental features, the encoder's chunk buffer, CTC and the streaming decoder with its endpoints
and optional LAS rescoring) built without an encoder step of its own: the ``Batcher`` takes one
chunk from every stream that has one, runs them as one ``stream_step`` and hands each stream its
rows back (``encoded``). Everything but ``push`` / ``end`` runs in the batcher's worker thread.

``Recognizer`` holds what all streams share: the model, its feature statistics, the chunking, the
decoder settings, and the batched encoder step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from usmkit.models.subsampling import feature_context
from usmkit.streaming.decoder import DecoderConfig, Segment
from usmkit.streaming.features import StreamingFbank
from usmkit.streaming.pipeline import LoadedModel, StreamingTranscriber
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

    ``step``: ``"jit"`` (a traced graph that serves every batch size, ``TracedStreamStep(any_batch=True)``)
    or ``"eager"`` (``stream_step``). ``chunk_size`` / ``left_chunks``: the mask streams run with.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        decoder_cfg: DecoderConfig,
        chunk_size: int,
        left_chunks: int,
        silence_db: float = -50.0,
        step: str = "jit",
    ) -> None:
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.features = loaded.cfg.data.features
        self.stats = loaded.stats
        self.decoder_cfg = decoder_cfg
        self.chunk_size, self.left_chunks = chunk_size, left_chunks
        self.silence_db = silence_db
        self.device = next(self.model.parameters()).device
        if step == "jit":
            from usmkit.streaming.traced_step import TracedStreamStep

            self.step = TracedStreamStep(self.model.encoder, any_batch=True)
        elif step == "eager":
            self.step = stream_step
        else:
            raise ValueError(f"step must be 'jit' or 'eager', got {step!r}")

    @property
    def sample_rate(self) -> int:
        return self.features.sample_rate

    def warm_up(self) -> None:
        """One batched step on zeros, so that tracing happens before the first client, not in its first chunk."""
        encoder = self.model.encoder
        param = next(encoder.parameters())
        first = param.new_zeros(1, feature_context(encoder.subsampling_factor), encoder.cfg.input_dim)  # (1, s - 1, F)
        state = stack_states([init_state(encoder, first, self.chunk_size, self.left_chunks)])
        chunk = param.new_zeros(1, state.chunk_input_frames, encoder.cfg.input_dim)  # (1, s C, F)
        with torch.no_grad():
            self.step(encoder, chunk, state, torch.tensor([state.chunk_input_frames], device=param.device))

    def run(
        self, chunks: list[torch.Tensor], lengths: list[torch.Tensor], states: list[EncoderStreamState]
    ) -> tuple[torch.Tensor, list[int], list[EncoderStreamState]]:
        """One step over the streams' next chunks (1, 4C, F) each -> out (B, C, D), valid frames per row, new states."""
        state = stack_states(states)
        with torch.no_grad():
            out, out_lens, new = self.step(self.model.encoder, torch.cat(chunks), state, torch.cat(lengths))
        return out, out_lens.tolist(), split_state(new)

    def new_stream(self, nbest: int = 1, continuous: bool = False) -> ServerStream:
        return ServerStream(self, nbest, continuous)


@dataclass
class _Inbox:
    """What the event loop hands a stream between two rounds: audio blocks and whether the end came."""

    blocks: list[np.ndarray] = field(default_factory=list)
    ended: bool = False


class ServerStream:
    """One client's recognition. ``push`` / ``end`` (event loop) queue audio; the batcher's worker calls
    ``take`` (features), ``next_chunk`` -> one batched step -> ``encoded`` (decoding), and ``wrap_up``.

    ``nbest``: texts per result (more than one only with ``ctc_beam``). ``continuous``: keep decoding
    after the first endpoint (WeNet's ``continuous_decoding``); otherwise the stream ends there.
    """

    def __init__(self, recognizer: Recognizer, nbest: int = 1, continuous: bool = False) -> None:
        r = recognizer
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
        )
        self.sample_rate = r.sample_rate
        self._inbox = _Inbox()
        self.samples_in = 0  # event loop: samples pushed
        # worker side
        self.done = False  # End was emitted
        self.failed = False  # the batcher gave up on it (an Error was emitted)
        self._samples_fed = 0
        self._end_fed = False
        self._tail_taken = False
        self._marks: deque[tuple[int, int]] = deque()  # (feature frames, samples) after each fed block
        self._frames_encoded = 0  # feature frames the encoder has consumed (3 + 4C per whole chunk)

    # ------------------------------------------------------------------ event loop side
    def push(self, samples: np.ndarray) -> None:
        """Queue samples (N,) float32 in [-1, 1] at the model's rate."""
        self._inbox.blocks.append(samples)
        self.samples_in += samples.size

    def end(self) -> None:
        """No more audio will come."""
        self._inbox.ended = True

    def collect(self) -> _Inbox:
        """Hand over what was queued since the last round (event loop, before the round starts)."""
        inbox, self._inbox = self._inbox, _Inbox(ended=self._inbox.ended)
        return inbox

    # ------------------------------------------------------------------ worker side
    @property
    def encoder(self):
        return self.transcriber.encoder

    def take(self, inbox: _Inbox) -> None:
        """Features of the queued audio into the encoder's buffer."""
        t = self.transcriber
        for block in inbox.blocks:
            t.encoder.queue(t.feed(block))
            self._samples_fed += block.size
            self._marks.append((t.fbank.num_frames, self._samples_fed))
        if inbox.ended and not self._end_fed:
            t.encoder.queue(t.feed_end())
            self._end_fed = True
            self._marks.append((t.fbank.num_frames, self._samples_fed))

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

    def encoded(self, out: torch.Tensor, frames: int, state: EncoderStreamState) -> list[Event]:
        """The batched step's row for this stream's chunk: out (1, C, D), its valid frames, the new state."""
        enc = self.encoder.advance(out, state, frames)  # (1, n, D)
        self._frames_encoded = self.encoder.feature_context + self.encoder.chunks * state.chunk_input_frames
        audio_ms = self._audio_ms()
        events: list[Event] = []
        for segment in self.transcriber.frames.decode(enc[0]):
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

    @property
    def has_work(self) -> bool:
        """Whether the next round has something to do for this stream without new audio."""
        if self.done or self.failed:
            return False
        return bool(self.encoder.chunks_ready) or self._end_fed

    def _final(self, segment: Segment, audio_ms: int) -> list[Event]:
        if self.continuous:
            return [Final(segment, audio_ms)]
        self.done = True
        return [Final(segment, audio_ms), End(audio_ms)]

    def _audio_ms(self) -> int:
        """The stream's audio (ms) at the end of the block that completed the frames encoded so far."""
        while len(self._marks) > 1 and self._marks[0][0] < self._frames_encoded:
            self._marks.popleft()
        samples = self._marks[0][1] if self._marks else self._samples_fed
        return round(1000 * samples / self.sample_rate)
