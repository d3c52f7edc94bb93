"""The device side of batch transcription: features, encoder and CTC on the device; transcripts out.

Shapes: B batch, N samples, T feature frames, T' encoder frames, V vocabulary, D model dim.

``DeviceRunner.batch`` takes an ``AudioBatch`` (``usmkit.inference.batch_audio``): features on the
device when the workers sent samples, the encoder's full forward over the padded batch under the
checkpoint's mask (padding never reaches a valid frame: ``usmkit.models.conformer``), CTC log-probs.
Then

- ``ctc_greedy``: the frame-wise argmax and its posterior are taken on the device; only those (B, T')
  go to the host, into page-locked memory without waiting. The host turns the previous batch's into
  transcripts (``usmkit.inference.word_alignment``) while the device encodes this one: ``batch``
  returns a function that finishes the batch, which the caller runs after launching the next;
- ``ctc_lexicon``: the log-probs go to the host and to the ``LexiconPool`` (CPU processes), whose
  results arrive later (``poll``).

``DeviceRunner.long_piece`` takes the ``LongPiece``s of a file too long for a batch and encodes them
with ``usmkit.streaming.windowed.WindowedEncoder`` (the full forward's frames, window by window, in
flat memory). Greedy keeps only the argmax and its posterior per frame (8 bytes per 40 ms) and
decodes the whole file at its end. The lexicon search cannot take hours of log-probs at once: they
are cut into segments of about ``SEGMENT_FRAMES`` at the middle of the longest run of blank frames in
each segment's second half (where no word is spoken), decoded as the file goes on, and joined.

Every finished input is handed to ``emit(item, transcript)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from usmkit.device import autocast_context
from usmkit.inference.batch_audio import AudioBatch, FbankFrontEnd, LongPiece
from usmkit.inference.batch_inputs import AudioItem
from usmkit.inference.lexicon_pool import LexiconJob, LexiconPool
from usmkit.inference.word_alignment import Transcript, greedy_transcript, merge_transcripts
from usmkit.streaming.windowed import WindowedEncoder

SEGMENT_FRAMES = 750  # lexicon search on a long file: segments of about 30 s of 40 ms frames

Emit = Callable[[AudioItem, Transcript], None]


def compile_encoder(encoder: torch.nn.Module) -> None:
    """``torch.compile`` each Conformer block and the subsampling front end (in place), batch and time
    dynamic: one graph for every identical block and every batch shape, compiled minutes sooner than the
    whole encoder; the glue between them (masks, rotary tables) stays eager."""
    for module in (encoder.subsampling, *encoder.blocks):
        module.forward = torch.compile(module.forward, dynamic=True)


@dataclass
class _Long:
    """A long file being encoded: its windowed encoder and what its frames gave so far."""

    item: AudioItem
    encoder: WindowedEncoder
    frames: int = 0  # encoder frames so far
    ids: list[np.ndarray] = field(default_factory=list)  # greedy: argmax per frame
    probs: list[np.ndarray] = field(default_factory=list)  # greedy: its posterior
    pending: list[torch.Tensor] = field(default_factory=list)  # lexicon: log-probs (t, V) not yet submitted
    segments: list[int] = field(default_factory=list)  # lexicon: frames of each submitted segment
    results: dict[int, Transcript] = field(default_factory=dict)  # lexicon: segment -> its transcript
    ended: bool = False


class DeviceRunner:
    """Encodes batches and long files on ``device``; hands finished transcripts to ``emit``."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        chunk_size: int | None,
        left_chunks: int,
        device: torch.device,
        precision: str,
        frame_s: float,
        emit: Emit,
        front_end: FbankFrontEnd | None = None,
        pool: LexiconPool | None = None,
        window_chunks: int | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.C, self.K = chunk_size, left_chunks
        self.device, self.precision, self.frame_s = device, precision, frame_s
        self.emit = emit
        self.front_end = front_end  # features on the device (None: the workers made them)
        self.pool = pool
        self.window_chunks = window_chunks
        self._long: dict[str, _Long] = {}

    def _context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(autocast_context(self.device, self.precision))
        return stack

    def warm_up(self, rows: int, frames: int, num_bins: int) -> None:
        """The encoder and CTC on zeros of the largest batch's shape (``rows`` x ``frames`` feature frames), then
        of one row: a compiled encoder (``compile_encoder``) compiles here, before the clock starts, not in the
        first batches (one graph with dynamic shapes, and the one torch specializes for a single row), and the
        device's memory cache already holds blocks as large as any batch needs."""
        for n in (max(rows, 2), 1):
            with torch.inference_mode():
                feats = torch.zeros(n, frames, num_bins, device=self.device)
                lens = torch.full((n,), frames, device=self.device)
            self._encode(feats, lens)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _encode(self, feats: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (B, T, F) and their frames (B,), made under inference mode (a compiled encoder's guards
        tell inference tensors from others: a batch made otherwise would compile again) -> CTC log-probs
        (B, T', V) float32 and encoder frames (B,)."""
        with self._context():
            enc, enc_lens = self.model.encoder(feats, lens, self.C, self.K)  # (B, T', D), (B,)
            return self.model.ctc(enc), enc_lens

    # ------------------------------------------------------------------------------------------ batches
    def batch(self, batch: AudioBatch) -> Callable[[], None]:
        """Launch ``batch`` on the device; returns the function that finishes it on the host."""
        if not batch.items:
            return lambda: None
        with torch.inference_mode():
            if batch.features is None:
                waves = batch.waves.to(self.device, non_blocking=True)
                feats, lens = self.front_end(waves, batch.num_samples)  # (B, T, F), (B,)
            else:  # copies even on the CPU: inference tensors, as the warm-up's
                feats = batch.features.to(self.device, non_blocking=True, copy=True)
                lens = batch.feature_lens.to(self.device, non_blocking=True, copy=True)
        log_probs, enc_lens = self._encode(feats, lens)  # (B, T', V), (B,)
        with self._context():
            if self.pool is None:
                best, ids = log_probs.max(dim=-1)  # (B, T') each, on the device
                host = _HostCopy(best.exp(), ids.to(torch.int32), enc_lens)
            else:
                host = _HostCopy(log_probs, enc_lens)
        items = list(batch.items)
        if self.pool is None:
            return lambda: self._finish_greedy(items, host)
        return lambda: self._submit(items, host)

    def _finish_greedy(self, items: list[AudioItem], host: _HostCopy) -> None:
        probs, ids, lens = (t.numpy() for t in host.wait())
        for b, item in enumerate(items):
            n = int(lens[b])
            self.emit(item, greedy_transcript(ids[b, :n], probs[b, :n], self.tokenizer, self.frame_s))

    def _submit(self, items: list[AudioItem], host: _HostCopy) -> None:
        log_probs, lens = host.wait()
        # Copies in ordinary memory: they travel to the pool's processes through shared memory, which page-locked
        # memory (the device's copy) cannot be moved into; and each row keeps only its own frames.
        rows = [log_probs[b, : int(lens[b])].clone() for b in range(len(items))]
        self.pool.submit(LexiconJob(("batch", items), rows, [0.0] * len(items)))
        self.poll()

    # ------------------------------------------------------------------------------------------ long files
    def long_piece(self, piece: LongPiece) -> None:
        """Encode the next piece of a long file; at its last piece, finish the file."""
        item = piece.item
        state = self._long.get(item.id)
        if state is None:
            windowed = WindowedEncoder(self.model.encoder, self.C, self.K, self.window_chunks)
            state = self._long[item.id] = _Long(item, windowed)
        with self._context():
            feats = piece.features.to(self.device)
            enc = state.encoder.accept(feats)  # (1, n, D)
            if piece.last:
                enc = torch.cat([enc, state.encoder.flush()], dim=1)
            log_probs = self.model.ctc(enc)[0].float()  # (n, V)
        state.frames += log_probs.shape[0]
        if self.pool is None:
            best, ids = log_probs.max(dim=-1)
            state.ids.append(ids.to(torch.int32).cpu().numpy())
            state.probs.append(best.exp().cpu().numpy())
            if piece.last:
                del self._long[item.id]
                ids_all, probs_all = np.concatenate(state.ids), np.concatenate(state.probs)
                self.emit(item, greedy_transcript(ids_all, probs_all, self.tokenizer, self.frame_s))
            return
        state.pending.append(log_probs.cpu().clone())  # ordinary memory (see _submit)
        self._submit_segments(state, final=piece.last)
        state.ended = piece.last
        self.poll()

    def drop(self, item_id: str) -> None:
        """Forget a long file whose audio failed part way (its error is reported by the caller)."""
        self._long.pop(item_id, None)

    def _submit_segments(self, state: _Long, final: bool) -> None:
        buffer = torch.cat(state.pending) if state.pending else torch.zeros(0, 1)
        start = sum(state.segments)
        while buffer.shape[0] >= 2 * SEGMENT_FRAMES or (final and buffer.shape[0] > 0):
            cut = buffer.shape[0] if buffer.shape[0] < 2 * SEGMENT_FRAMES else blank_cut(buffer[: 2 * SEGMENT_FRAMES])
            segment, buffer = buffer[:cut], buffer[cut:]
            index = len(state.segments)
            state.segments.append(cut)
            self.pool.submit(LexiconJob(("long", state.item.id, index), [segment], [start * self.frame_s]))
            start += cut
        state.pending = [buffer] if buffer.shape[0] else []
        if final and not state.segments:  # no frame at all
            self.emit(state.item, Transcript("", 0.0, ()))
            del self._long[state.item.id]

    # ------------------------------------------------------------------------------------------ lexicon results
    def poll(self, wait: bool = False) -> None:
        """Hand on the lexicon results that are ready (``wait``: all, once every job is submitted)."""
        if self.pool is None:
            return
        for tag, transcripts in self.pool.drain() if wait else self.pool.finished():
            if tag[0] == "batch":
                for item, transcript in zip(tag[1], transcripts, strict=True):
                    self.emit(item, transcript)
                continue
            _, item_id, index = tag
            state = self._long.get(item_id)
            if state is None:  # dropped: its audio failed part way
                continue
            state.results[index] = transcripts[0]
            if state.ended and len(state.results) == len(state.segments):
                del self._long[item_id]
                parts = [state.results[i] for i in range(len(state.segments))]
                self.emit(state.item, merge_transcripts(parts, state.segments))


def blank_cut(log_probs: torch.Tensor, blank: int = 0) -> int:
    """Where to cut log-probs (n, V) of a long input: the middle of the longest run of frames whose
    argmax is blank in the second half (n when none is).

    >>> lp = torch.full((8, 3), -5.0); lp[:, 1] = 0.0; lp[5:7, 0] = 1.0  # frames 5, 6 blank
    >>> blank_cut(lp)
    6
    """
    n = log_probs.shape[0]
    is_blank = (log_probs[n // 2 :].argmax(dim=-1) == blank).numpy()
    best_len, best_mid, run = 0, n, 0
    for i, b in enumerate(is_blank):
        run = run + 1 if b else 0
        if run > best_len:
            best_len, best_mid = run, n // 2 + i - run // 2 + 1
    return best_mid if best_len else n


class _HostCopy:
    """Tensors copied to the host without the host waiting for the device; ``wait`` returns them once there."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.event = None
        if tensors[0].device.type == "cuda":
            self.tensors = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for dst, src in zip(self.tensors, tensors, strict=True):
                dst.copy_(src, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.tensors = [t.cpu() for t in tensors]

    def wait(self) -> list[torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()
        return self.tensors
