"""The two graphs an export holds, as modules with tensors only in and out (what exporters trace).

Shapes: B batch (dynamic in both graphs), T feature frames, F feature bins, C chunk size (encoder
frames), K left chunks, L layers, H heads, Dh head dim, D model dim, Kc conv kernel, V vocabulary.

``StreamStepGraph`` is ``usmkit.streaming.step.stream_step`` followed by the CTC head, with the
state dataclass ``EncoderStreamState`` spelled out as tensors in ``STATE_NAMES`` order (its tensor
fields, in declaration order; ``chunk_size`` and ``left_chunks`` are constants of the graph)::

    inputs   chunk (B, 4C, F) float32, lengths (B,) int64,
             kv (L, 2, B, H, K C, Dh) float32, cached () int64, conv_tail (L, B, Kc - 1, D) float32,
             feat_ctx (B, 3, F) float32, offset () int64
    outputs  enc (B, C, D) float32, log_probs (B, C, V) float32, out_lens (B,) int64,
             new_kv, new_cached, new_conv_tail, new_feat_ctx, new_offset (the inputs' shapes)

``OfflineGraph`` is the encoder's full forward under the trained chunk mask and the CTC head::

    inputs   features (B, T, F) float32, lengths (B,) int64
    outputs  log_probs (B, T', V) float32, out_lens (B,) int64, T' = (T - 3) // 4, T >= 11
"""

from __future__ import annotations

import torch
from torch import nn

from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ctc import CTCHead
from usmkit.models.subsampling import feature_context
from usmkit.streaming.step import STATE_TENSORS, EncoderStreamState, init_state, stream_step

STATE_NAMES = STATE_TENSORS  # the state's inputs and outputs, in this order
STEP_INPUTS: tuple[str, ...] = ("chunk", "lengths", *STATE_NAMES)
STEP_OUTPUTS: tuple[str, ...] = ("enc", "log_probs", "out_lens", *(f"new_{n}" for n in STATE_NAMES))
OFFLINE_INPUTS: tuple[str, ...] = ("features", "lengths")
OFFLINE_OUTPUTS: tuple[str, ...] = ("log_probs", "out_lens")
# The offline graph takes at least 11 feature frames (2 encoder frames; 7 make one): torch.export
# specializes a time axis of size 1 (broadcasting), so the dynamic axis starts above it.
MIN_OFFLINE_FRAMES = 11
EXAMPLE_BATCH = 2  # traced with B = 2: an example of size 1 would fix the batch at 1 (torch.export specializes it)


class StreamStepGraph(nn.Module):
    """One streaming chunk, state in and state out (see the module docstring for the I/O)."""

    def __init__(self, encoder: ConformerEncoder, ctc: CTCHead, chunk_size: int, left_chunks: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.ctc = ctc
        self.chunk_size = chunk_size
        self.left_chunks = left_chunks

    def forward(
        self,
        chunk: torch.Tensor,  # (B, 4 C, F)
        lengths: torch.Tensor,  # (B,)
        kv: torch.Tensor,
        cached: torch.Tensor,
        conv_tail: torch.Tensor,
        feat_ctx: torch.Tensor,
        offset: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        s = self.encoder.subsampling_factor
        state = EncoderStreamState(kv, cached, conv_tail, feat_ctx, offset, self.chunk_size, self.left_chunks, s)
        enc, out_lens, new = stream_step(self.encoder, chunk, state, lengths)  # (B, C, D), (B,)
        return enc, self.ctc(enc), out_lens, *new.tensors

    def example_inputs(self, batch: int = EXAMPLE_BATCH) -> tuple[torch.Tensor, ...]:
        """Inputs of the first chunk of ``batch`` streams (zeros), in ``STEP_INPUTS`` order."""
        F_in = self.encoder.cfg.input_dim
        state = init_state(
            self.encoder,
            torch.zeros(batch, feature_context(self.encoder.subsampling_factor, self.encoder.cfg.front_end), F_in),
            self.chunk_size,
            self.left_chunks,
        )
        chunk = torch.zeros(batch, state.chunk_input_frames, F_in)  # (B, s C, F)
        lengths = torch.full((batch,), state.chunk_input_frames, dtype=torch.long)
        return chunk, lengths, *state.tensors

    def dynamic_shapes(self) -> dict[str, dict[int, torch.export.Dim] | None]:
        """The batch axis of every input (``torch.export`` / ``torch.onnx.export(dynamo=True)`` form)."""
        B = torch.export.Dim("batch", min=1, max=1024)
        return {"chunk": {0: B}, "lengths": {0: B}, "kv": {2: B}, "cached": None, "conv_tail": {1: B},
                "feat_ctx": {0: B}, "offset": None}  # fmt: skip


class OfflineGraph(nn.Module):
    """Whole utterances: features (B, T, F), lengths (B,) -> log_probs (B, T', V), out_lens (B,)."""

    def __init__(self, encoder: ConformerEncoder, ctc: CTCHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.ctc = ctc

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        enc, out_lens = self.encoder(features, lengths)  # (B, T', D) under the config's chunk mask, (B,)
        return self.ctc(enc), out_lens

    def example_inputs(self, batch: int = EXAMPLE_BATCH, frames: int = 101) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.zeros(batch, frames, self.encoder.cfg.input_dim)  # (B, T, F)
        return features, torch.full((batch,), frames, dtype=torch.long)

    def dynamic_shapes(self) -> dict[str, dict[int, torch.export.Dim]]:
        B = torch.export.Dim("batch", min=1, max=1024)
        T = torch.export.Dim("frames", min=MIN_OFFLINE_FRAMES, max=1 << 20)
        return {"features": {0: B, 1: T}, "lengths": {0: B}}
