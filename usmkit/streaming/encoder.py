"""A streaming encoder: feature frames in, in pieces of any size; encoder frames out, chunk by chunk.

Shapes: B batch, C chunk size (encoder frames), F feature bins, D model dim, s subsampling factor.
It picks how each chunk runs (eager ``stream_step``, traced, compiled, an exported engine, or the
caller's step); the step itself (``usmkit.streaming.step``) holds no strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

from usmkit.models.conformer import ConformerEncoder
from usmkit.models.subsampling import feature_context
from usmkit.streaming.step import EncoderStreamState, check_streamable, init_state, stream_step
from usmkit.streaming.traced_step import TracedStreamStep


class StreamingEncoder:
    """Feature frames in, in pieces of any size; encoder frames out, a whole chunk at a time.

    Buffers at most ``s C + s - 2`` feature frames between calls. ``flush()`` encodes what is left at the
    end of the stream, so the frames of ``accept`` + ``flush`` are those of the full forward.
    ``step`` picks how each chunk runs: ``"eager"`` calls ``stream_step``; ``"jit"`` runs it traced
    and frozen (``usmkit.streaming.traced_step``: same output, no Python overhead per op, a few seconds
    to trace on the first chunk); ``"compile"`` wraps it in ``torch.compile`` (static shapes; minutes
    to compile on a CPU); an engine with ``stream_step``'s signature, e.g. an exported model
    (``usmkit.export.engine``); or ``None``: no step of its own, the caller runs each chunk
    (``next_chunk`` -> a step of its choice -> ``advance``), as a server that batches the chunks of many streams does.

    >>> enc = ConformerEncoder(ConformerConfig(d_model=32, num_layers=1, num_heads=2, causal_conv=True,
    ...                                        chunk_size=2, left_chunks=1, dropout=0.0)).eval()
    >>> s = StreamingEncoder(enc)
    >>> feats = torch.randn(1, 30, 80)
    >>> out = torch.cat([s.accept(feats[:, :13]), s.accept(feats[:, 13:]), s.flush()], dim=1)
    >>> torch.allclose(out, enc(feats, torch.tensor([30]))[0], atol=1e-5)
    True
    """

    def __init__(
        self,
        encoder: ConformerEncoder,
        chunk_size: int | None = None,
        left_chunks: int | None = None,
        step: Literal["eager", "jit", "compile"] | Callable | None = "eager",
    ) -> None:
        self.encoder = encoder
        self.chunk_size, self.left_chunks = check_streamable(encoder.cfg, chunk_size, left_chunks)
        self.feature_context = feature_context(
            encoder.cfg.subsampling_factor, encoder.cfg.front_end
        )  # s - 1 (0 stacked)
        if step == "eager":
            self._step = stream_step
        elif step == "jit":
            self._step = TracedStreamStep(encoder)
        elif step == "compile":
            self._step = torch.compile(stream_step, dynamic=False)
        elif step is None:
            self._step = None
        elif callable(step):  # an engine: step(encoder, chunk, state, lengths) -> (out, out_lens, state)
            self._step = step
        else:
            raise ValueError(f"step must be 'eager', 'jit', 'compile' or None, got {step!r}")
        self.reset()

    def warm_up(self, batch_size: int = 1) -> None:
        """Run one step on zeros, outside any stream, so that tracing or compiling (``step="jit"`` /
        ``"compile"``) happens now rather than inside the first chunk of a stream."""
        if self._step is None:
            return
        param = next(self.encoder.parameters(), None)  # None: an engine's encoder holds no weights (CPU)
        like = param if param is not None else torch.zeros(())
        F_in = self.encoder.cfg.input_dim
        state = init_state(
            self.encoder,
            like.new_zeros(batch_size, self.feature_context, F_in),
            self.chunk_size,
            self.left_chunks,
        )
        chunk = like.new_zeros(batch_size, state.chunk_input_frames, F_in)  # (B, s C, F)
        lengths = torch.full((batch_size,), state.chunk_input_frames, dtype=torch.long, device=like.device)
        with torch.no_grad():
            self._step(self.encoder, chunk, state, lengths)

    def reset(self) -> None:
        """Start a new stream (all caches cleared)."""
        self.state: EncoderStreamState | None = None
        self._pending: torch.Tensor | None = None  # (B, t, F) feature frames not yet encoded
        self.frames_out = 0  # encoder frames returned so far
        self.chunks = 0  # stream_step calls so far

    def _empty(self, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(like.shape[0], 0, self.encoder.cfg.d_model)

    # ------------------------------------------------------------------ buffering (any step)
    def queue(self, features: torch.Tensor) -> None:
        """Buffer features (B, t, F), t >= 0; the stream's first s - 1 frames start its state."""
        if features.dim() != 3 or features.shape[2] != self.encoder.cfg.input_dim:
            raise ValueError(f"features must be (B, t, {self.encoder.cfg.input_dim}), got {tuple(features.shape)}")
        pending = features if self._pending is None else torch.cat([self._pending, features], dim=1)  # (B, t', F)
        if self.state is None and pending.shape[1] >= self.feature_context:
            context = self.feature_context
            self.state = init_state(self.encoder, pending[:, :context], self.chunk_size, self.left_chunks)
            pending = pending[:, context:]
        self._pending = pending

    @property
    def chunks_ready(self) -> int:
        """Whole chunks in the buffer, ready to encode."""
        if self.state is None or self._pending is None:
            return 0
        return self._pending.shape[1] // self.state.chunk_input_frames

    def next_chunk(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the next whole chunk (B, s C, F) and its lengths (B,) from the buffer. Run it with
        ``self.state`` and give the step's output to ``advance``."""
        if not self.chunks_ready:
            raise RuntimeError("no whole chunk is buffered: check chunks_ready first")
        n = self.state.chunk_input_frames
        chunk, self._pending = self._pending[:, :n], self._pending[:, n:]
        return chunk, torch.full((chunk.shape[0],), n, dtype=torch.long, device=chunk.device)

    def last_chunk(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """At the end of the stream, after the whole chunks: the buffered tail zero-padded to one chunk
        (B, s C, F) and its valid lengths (B,), or None when it makes no encoder frame. Empties the buffer."""
        if self.chunks_ready:
            raise RuntimeError("encode the whole chunks (chunks_ready) before the last one")
        pending = self._pending
        if pending is None or self.state is None:  # fewer than s - 1 frames in all (the full forward needs 2 s - 1)
            self._pending = None if pending is None else pending[:, :0]
            return None
        self._pending = pending[:, :0]
        rest = pending.shape[1]
        if int(self.encoder.output_lengths(torch.tensor(rest + self.feature_context))) == 0:
            return None
        chunk = F.pad(pending, (0, 0, 0, self.state.chunk_input_frames - rest))  # (B, s C, F): zeros after the valid
        return chunk, torch.full((pending.shape[0],), rest, dtype=torch.long, device=pending.device)

    def advance(self, out: torch.Tensor, state: EncoderStreamState, frames: int | None = None) -> torch.Tensor:
        """Take the step's result for the chunk from ``next_chunk`` / ``last_chunk``: out (B, C, D) and the
        new state; ``frames``: its valid output frames (the last chunk's ``out_lens``; None = all C).
        Returns out's valid frames (B, n, D)."""
        self.state = state
        self.chunks += 1
        out = out if frames is None else out[:, :frames]  # (B, n, D)
        self.frames_out += out.shape[1]
        return out

    # ------------------------------------------------------------------ running (own step)
    def _check_own_step(self) -> None:
        if self._step is None:
            raise RuntimeError(
                "this StreamingEncoder has no step (step=None): run its chunks with next_chunk / advance"
            )

    def accept(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, t, F), t >= 0 -> the encoder frames (B, n C, D) that became computable (n >= 0)."""
        self._check_own_step()
        self.queue(features)
        outs = []
        while self.chunks_ready:
            chunk, lengths = self.next_chunk()
            with torch.no_grad():
                out, _, state = self._step(self.encoder, chunk, self.state, lengths)
            outs.append(self.advance(out, state))
        return torch.cat(outs, dim=1) if outs else self._empty(features)

    def flush(self) -> torch.Tensor:
        """The last encoder frames (B, r, D), r < C, from the buffered tail; ``reset()`` before a new stream."""
        self._check_own_step()
        pending = self._pending
        if pending is None:
            return torch.zeros(0, 0, self.encoder.cfg.d_model)
        taken = self.last_chunk()
        if taken is None:
            return self._empty(pending)
        chunk, lengths = taken
        with torch.no_grad():
            out, out_lens, state = self._step(self.encoder, chunk, self.state, lengths)
        return self.advance(out, state, int(out_lens.max()))
