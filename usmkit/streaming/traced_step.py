"""``stream_step`` traced to TorchScript: the same step without Python's per-op overhead.

Shapes: B batch, C chunk size (encoder frames), K left chunks, F feature bins, D model dim.

Why our own wrapper: a streaming chunk is dozens of small operations per Conformer layer on a few
frames, so in eager mode on a CPU much of the chunk's time is Python and dispatch between the
operations, not arithmetic (``bench/streaming.py`` measures eager and traced side by side).
``torch.compile`` removes that overhead as well, but inductor takes minutes to compile the step on
a CPU; ``torch.jit.trace`` + ``torch.jit.freeze`` take seconds and also cover int8 dynamically
quantized linears.

Tracing records the operations of one call. ``stream_step`` has no data-dependent Python control
flow (valid lengths, the cache fill and the rotary offset are tensors), so the graph traced for one
(batch size, chunk size, left chunks, device, dtype) serves every chunk of every stream of that
shape, the stream's first chunk and its shorter last chunk included. ``tests/models/test_traced_step.py``
holds the traced stream to the eager one.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from usmkit.models.conformer import ConformerEncoder
from usmkit.streaming.step import EncoderStreamState, chunk_lengths, stream_step


class _StepModule(nn.Module):
    """``stream_step`` with the state spelled out as tensors (what ``torch.jit.trace`` takes and returns)."""

    def __init__(self, encoder: ConformerEncoder, chunk_size: int, left_chunks: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.chunk_size = chunk_size
        self.left_chunks = left_chunks

    def forward(
        self,
        chunk: torch.Tensor,  # (B, s C, F)
        lengths: torch.Tensor,  # (B,)
        kv: torch.Tensor,
        cached: torch.Tensor,
        conv_tail: torch.Tensor,
        feat_ctx: torch.Tensor,
        offset: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        s = self.encoder.subsampling_factor
        state = EncoderStreamState(kv, cached, conv_tail, feat_ctx, offset, self.chunk_size, self.left_chunks, s)
        out, out_lens, new = stream_step(self.encoder, chunk, state, lengths)
        return out, out_lens, *new.tensors


class TracedStreamStep:
    """A drop-in for ``stream_step(encoder, chunk, state, lengths)`` that runs a traced, frozen graph.

    The graph is traced on the first call for each (B, C, K, device, dtype, per-row state or not) and
    kept; the encoder must stay in eval mode and unchanged afterwards (freezing copies its weights
    into the graph). ``any_batch=True`` leaves B out of the key: one graph serves every batch size
    (the traced graph reads the batch size from its inputs), as a server whose batches change size
    from one step to the next needs; ``tests/models/test_stream_step.py`` holds such a graph to the
    eager step over batches of changing size.
    """

    def __init__(self, encoder: ConformerEncoder, any_batch: bool = False) -> None:
        if encoder.training:
            raise ValueError("trace the streaming step of an encoder in eval mode: call encoder.eval() first")
        self.encoder = encoder
        self.any_batch = any_batch
        self._graphs: dict[tuple, torch.jit.ScriptModule] = {}

    def _graph(self, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor) -> torch.jit.ScriptModule:
        batch = None if self.any_batch else chunk.shape[0]
        key = (batch, state.chunk_size, state.left_chunks, chunk.device, chunk.dtype, state.offset.dim())
        if key not in self._graphs:
            module = _StepModule(self.encoder, state.chunk_size, state.left_chunks).eval()
            example = (chunk, lengths, state.kv, state.cached, state.conv_tail, state.feat_ctx, state.offset)
            with torch.no_grad(), warnings.catch_warnings():
                # The tracer warns about the step's shape checks (Python bools of constant shapes): they
                # hold for every call with this key, which is what the key guarantees.
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                traced = torch.jit.trace(module, example, check_trace=False)
            graph = torch.jit.freeze(traced)
            # TorchScript's profiling executor specializes a graph over its first two calls; running
            # them here keeps that slow start out of the stream's first chunks.
            with torch.no_grad():
                for _ in range(2):
                    graph(*example)
            self._graphs[key] = graph
        return self._graphs[key]

    def __call__(
        self,
        encoder: ConformerEncoder,
        chunk: torch.Tensor,
        state: EncoderStreamState,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, EncoderStreamState]:
        """Same contract as ``stream_step``: chunk (B, s C, F) -> (out (B, C, D), out_lens (B,), new state)."""
        if encoder is not self.encoder:
            raise ValueError("this traced step belongs to another encoder; build a TracedStreamStep per encoder")
        lengths = chunk_lengths(chunk, state, lengths)  # the graph has no shape checks of its own: traced away
        graph = self._graph(chunk, state, lengths)
        with torch.no_grad():
            out, out_lens, kv, cached, conv_tail, feat_ctx, offset = graph(chunk, lengths, *state.tensors)
        return out, out_lens, state.with_tensors((kv, cached, conv_tail, feat_ctx, offset))
