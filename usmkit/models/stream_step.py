"""Chunk-by-chunk inference of the Conformer encoder with a fixed-shape state.

Shapes: B batch, T feature frames (10 ms), F feature bins, C chunk size (encoder frames, 40 ms),
K left chunks, L layers, H heads, Dh head dim, D model dim, Kc conv kernel.

One ``stream_step`` turns the next ``4 C`` feature frames into the next ``C`` encoder frames, exactly
the frames ``ConformerEncoder.forward`` computes for those positions under the same chunk mask
(``chunk_size=C``, ``left_chunks=K``) with causal convolution. Each layer runs the block's own body
(``ConformerBlock.before_attention`` / ``after_attention``); only the attention differs, over the
cached keys and values. What it carries between chunks is ``EncoderStreamState``, tensors of
constant shape only:

- ``feat_ctx`` (B, 3, F): the subsampling reads input frames ``4t .. 4t + 6`` for output ``t``, so
  the last 3 feature frames of one chunk are read again by the next. The stream therefore starts with
  ``init_state(encoder, first_frames)`` holding the first 3 frames; each step then consumes 4 C new
  ones. Encoder output lags the feature input by these 3 frames (30 ms); ``StreamingEncoder.flush``
  encodes the tail.
- ``kv`` (L, 2, B, H, K C, Dh): rotated keys and values of the K previous chunks per layer, rolled by
  ``cat([kv[..., C:, :], new], dim=-2)`` (same size every step), and ``cached`` (number of valid
  frames in it, < K C only during the first K chunks).
- ``conv_tail`` (L, B, Kc - 1, D): the last Kc - 1 inputs of each causal depthwise convolution
  (time before channels, as ``ConvolutionModule.depthwise`` takes its context).
- ``offset``: absolute index of the chunk's first encoder frame, for the rotary positions.

Requirements (``check_streamable``): ``causal_conv=True``, a finite ``chunk_size`` and
``left_chunks >= 0``. ``left_chunks=-1`` (unbounded history) is refused unless the caller passes an
explicit cap, which is then an approximation of the trained model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.rotary import RotaryTable
from usmkit.models.subsampling import RECEPTIVE_FIELD, SUBSAMPLING_FACTOR, output_lengths

FEATURE_CONTEXT = RECEPTIVE_FIELD - SUBSAMPLING_FACTOR  # 3 feature frames read by two consecutive chunks


class NotStreamableError(ValueError):
    """The encoder (or the requested chunking) cannot run chunk by chunk."""


def check_streamable(
    cfg: ConformerConfig, chunk_size: int | None = None, left_chunks: int | None = None
) -> tuple[int, int]:
    """The (chunk_size, left_chunks) a stream of ``cfg`` runs with; raises ``NotStreamableError`` with the reason.

    ``chunk_size`` / ``left_chunks``: None takes the config's value; anything else overrides it (a
    different mask than the model was trained with).
    """
    C = cfg.chunk_size if chunk_size is None else chunk_size
    K = cfg.left_chunks if left_chunks is None else left_chunks
    if not cfg.causal_conv:
        raise NotStreamableError(
            "the encoder's convolution is not causal (causal_conv=False): it reads future frames, so the "
            "model was not trained for streaming"
        )
    if C is None:
        raise NotStreamableError(
            "the encoder uses full attention (chunk_size=None): every frame attends to the whole utterance, "
            "so the model was not trained for streaming"
        )
    if not isinstance(C, int) or C <= 0:
        raise NotStreamableError(f"chunk_size must be a positive number of encoder frames, got {C!r}")
    if K == -1:
        raise NotStreamableError(
            "the encoder attends to all left context (left_chunks=-1), which has no fixed-size cache; "
            "pass left_chunks=K to cap the history at K chunks (an approximation of the trained model)"
        )
    if not isinstance(K, int) or K < 0:
        raise NotStreamableError(f"left_chunks must be >= 0 for streaming, got {K!r}")
    return C, K


@dataclass(frozen=True)
class EncoderStreamState:
    """What ``stream_step`` carries from one chunk to the next; every tensor keeps its shape for the whole stream."""

    kv: torch.Tensor  # (L, 2, B, H, K * C, Dh) rotated keys (0) and values (1) of the K previous chunks
    cached: torch.Tensor  # () long: valid frames at the end of kv's time axis, 0 .. K * C
    conv_tail: torch.Tensor  # (L, B, Kc - 1, D) last inputs of each layer's causal depthwise convolution
    feat_ctx: torch.Tensor  # (B, 3, F) the last 3 feature frames consumed, read again by the next chunk
    offset: torch.Tensor  # () long: absolute encoder frame index of the next chunk's first frame
    chunk_size: int
    left_chunks: int

    @property
    def batch_size(self) -> int:
        return self.feat_ctx.shape[0]

    @property
    def chunk_input_frames(self) -> int:
        """Feature frames one ``stream_step`` consumes: 4 C."""
        return SUBSAMPLING_FACTOR * self.chunk_size


def init_state(
    encoder: ConformerEncoder,
    first_frames: torch.Tensor,
    chunk_size: int | None = None,
    left_chunks: int | None = None,
) -> EncoderStreamState:
    """The state before the first chunk: empty caches and the stream's first 3 feature frames (B, 3, F).

    ``chunk_size`` / ``left_chunks`` default to the encoder config's (see ``check_streamable``).
    """
    cfg = encoder.cfg
    C, K = check_streamable(cfg, chunk_size, left_chunks)
    if first_frames.dim() != 3 or first_frames.shape[1:] != (FEATURE_CONTEXT, cfg.input_dim):
        raise ValueError(
            f"first_frames must be the stream's first (B, {FEATURE_CONTEXT}, {cfg.input_dim}) feature frames, "
            f"got {tuple(first_frames.shape)}"
        )
    B, device, dtype = first_frames.shape[0], first_frames.device, first_frames.dtype
    L, H, Dh, D = cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.d_model
    return EncoderStreamState(
        kv=torch.zeros(L, 2, B, H, K * C, Dh, device=device, dtype=dtype),
        cached=torch.zeros((), dtype=torch.long, device=device),
        conv_tail=torch.zeros(L, B, cfg.conv_kernel - 1, D, device=device, dtype=dtype),
        feat_ctx=first_frames,
        offset=torch.zeros((), dtype=torch.long, device=device),
        chunk_size=C,
        left_chunks=K,
    )


def chunk_lengths(chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor | None) -> torch.Tensor:
    """Check that chunk (B, 4 C, F) fits ``state``; the chunk's valid frames (B,), all 4 C when ``lengths`` is None."""
    B, Tc, Fb = chunk.shape
    if Tc != state.chunk_input_frames or (B, Fb) != (state.batch_size, state.feat_ctx.shape[2]):
        raise ValueError(
            f"chunk must be (B={state.batch_size}, 4 x chunk_size = {state.chunk_input_frames}, "
            f"F={state.feat_ctx.shape[2]}) feature frames, got {tuple(chunk.shape)}"
        )
    if lengths is None:
        lengths = torch.full((B,), Tc, dtype=torch.long, device=chunk.device)
    return lengths


@torch.no_grad()
def stream_step(
    encoder: ConformerEncoder,
    chunk: torch.Tensor,
    state: EncoderStreamState,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, EncoderStreamState]:
    """Encode the next chunk: chunk (B, 4 C, F) feature frames -> (out (B, C, D), out_lens (B,), new state).

    ``lengths`` (B,): valid feature frames of the chunk (default all 4 C). A chunk with fewer is the
    last one of its stream (its frames after the valid ones are padding): ``out_lens`` then counts the
    valid output frames, the rest of ``out`` is 0. Call ``encoder.eval()`` first.
    """
    C, K = state.chunk_size, state.left_chunks
    B = chunk.shape[0]
    lengths = chunk_lengths(chunk, state, lengths)
    frames = torch.cat([state.feat_ctx, chunk], dim=1)  # (B, 3 + 4C, F)
    x, _ = encoder.subsampling(frames, lengths + FEATURE_CONTEXT)  # (B, C, D)
    out_lens = output_lengths(lengths + FEATURE_CONTEXT)  # (B,) <= C
    valid = torch.arange(C, device=x.device)[None, :] < out_lens[:, None]  # (B, C)
    positions = state.offset + torch.arange(C, device=x.device)  # (C,) absolute frame indices
    rotary = RotaryTable.build(positions, encoder.cfg.head_dim, encoder.cfg.rotary_base)  # once for all layers
    # Keys: K C cached frames (the last `cached` of them valid), then this chunk's valid frames.
    cache_valid = torch.arange(K * C, device=x.device) >= K * C - state.cached  # (K C,)
    key_valid = torch.cat([cache_valid[None, :].expand(B, -1), valid], dim=1)  # (B, K C + C)
    # A row without any valid key (a finished row of a batch) attends to all: finite garbage, discarded.
    key_valid = key_valid | ~key_valid.any(dim=1, keepdim=True)
    attn_mask = key_valid[:, None, None, :]  # (B, 1, 1, K C + C)

    new_kv, new_tails = [], []
    for layer, block in enumerate(encoder.blocks):
        x, q, k, v = block.before_attention(x, rotary)  # (B, C, D); (B, H, C, Dh) each
        keys = torch.cat([state.kv[layer, 0], k], dim=2)  # (B, H, K C + C, Dh)
        values = torch.cat([state.kv[layer, 1], v], dim=2)  # (B, H, K C + C, Dh)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)  # (B, H, C, Dh)
        tail = state.conv_tail[layer]  # (B, Kc - 1, D)
        x, conv_in = block.after_attention(x, attn, valid, conv_context=tail)  # (B, C, D) each
        new_kv.append(torch.stack([keys[:, :, C:], values[:, :, C:]]))  # (2, B, H, K C, Dh): roll by C
        seen = torch.cat([tail, conv_in], dim=1)  # (B, Kc - 1 + C, D)
        new_tails.append(seen[:, seen.shape[1] - tail.shape[1] :])  # (B, Kc - 1, D)

    new_state = EncoderStreamState(
        kv=torch.stack(new_kv),  # (L, 2, B, H, K C, Dh)
        cached=(state.cached + C).clamp(max=K * C),
        conv_tail=torch.stack(new_tails),  # (L, B, Kc - 1, D)
        feat_ctx=frames[:, frames.shape[1] - FEATURE_CONTEXT :],  # (B, 3, F)
        offset=state.offset + C,
        chunk_size=C,
        left_chunks=K,
    )
    return x.masked_fill(~valid[:, :, None], 0.0), out_lens, new_state


class StreamingEncoder:
    """Feature frames in, in pieces of any size; encoder frames out, a whole chunk at a time.

    Buffers at most ``4 C + 2`` feature frames between calls. ``flush()`` encodes what is left at the
    end of the stream, so the frames of ``accept`` + ``flush`` are those of the full forward.
    ``step`` picks how each chunk runs: ``"eager"`` calls ``stream_step``; ``"jit"`` runs it traced
    and frozen (``usmkit.models.traced_step``: same output, no Python overhead per op, a few seconds
    to trace on the first chunk); ``"compile"`` wraps it in ``torch.compile`` (static shapes; minutes
    to compile on a CPU); or an engine with ``stream_step``'s signature, e.g. an exported model
    (``usmkit.export.engine``).

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
        step: Literal["eager", "jit", "compile"] | Callable = "eager",
    ) -> None:
        self.encoder = encoder
        self.chunk_size, self.left_chunks = check_streamable(encoder.cfg, chunk_size, left_chunks)
        if step == "eager":
            self._step = stream_step
        elif step == "jit":
            from usmkit.models.traced_step import TracedStreamStep  # imports this module

            self._step = TracedStreamStep(encoder)
        elif step == "compile":
            self._step = torch.compile(stream_step, dynamic=False)
        elif callable(step):  # an engine: step(encoder, chunk, state, lengths) -> (out, out_lens, state)
            self._step = step
        else:
            raise ValueError(f"step must be 'eager', 'jit' or 'compile', got {step!r}")
        self.reset()

    def warm_up(self, batch_size: int = 1) -> None:
        """Run one step on zeros, outside any stream, so that tracing or compiling (``step="jit"`` /
        ``"compile"``) happens now rather than inside the first chunk of a stream."""
        param = next(self.encoder.parameters(), None)  # None: an engine's encoder holds no weights (CPU)
        like = param if param is not None else torch.zeros(())
        F_in = self.encoder.cfg.input_dim
        state = init_state(
            self.encoder,
            like.new_zeros(batch_size, FEATURE_CONTEXT, F_in),
            self.chunk_size,
            self.left_chunks,
        )
        chunk = like.new_zeros(batch_size, state.chunk_input_frames, F_in)  # (B, 4C, F)
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

    def accept(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, t, F), t >= 0 -> the encoder frames (B, n C, D) that became computable (n >= 0)."""
        if features.dim() != 3 or features.shape[2] != self.encoder.cfg.input_dim:
            raise ValueError(f"features must be (B, t, {self.encoder.cfg.input_dim}), got {tuple(features.shape)}")
        pending = features if self._pending is None else torch.cat([self._pending, features], dim=1)  # (B, t', F)
        if self.state is None:
            if pending.shape[1] < FEATURE_CONTEXT:
                self._pending = pending
                return self._empty(features)
            self.state = init_state(self.encoder, pending[:, :FEATURE_CONTEXT], self.chunk_size, self.left_chunks)
            pending = pending[:, FEATURE_CONTEXT:]
        n = self.state.chunk_input_frames
        full = torch.full((pending.shape[0],), n, dtype=torch.long, device=pending.device)  # (B,)
        outs = []
        while pending.shape[1] >= n:
            with torch.no_grad():
                out, _, self.state = self._step(self.encoder, pending[:, :n], self.state, full)
            outs.append(out)
            pending = pending[:, n:]
        self._pending = pending
        self.chunks += len(outs)
        out = torch.cat(outs, dim=1) if outs else self._empty(features)
        self.frames_out += out.shape[1]
        return out

    def flush(self) -> torch.Tensor:
        """The last encoder frames (B, r, D), r < C, from the buffered tail; ``reset()`` before a new stream."""
        pending = self._pending
        if pending is None:
            return torch.zeros(0, 0, self.encoder.cfg.d_model)
        self._pending = pending[:, :0]
        if self.state is None:  # fewer than 3 frames in all: nothing to encode (the full forward needs 7)
            return self._empty(pending)
        rest = pending.shape[1]
        if int(output_lengths(torch.tensor(rest + FEATURE_CONTEXT))) == 0:
            return self._empty(pending)
        n = self.state.chunk_input_frames
        chunk = F.pad(pending, (0, 0, 0, n - rest))  # (B, 4C, F): zero frames after the valid ones
        lengths = torch.full((pending.shape[0],), rest, dtype=torch.long, device=pending.device)
        with torch.no_grad():
            out, out_lens, self.state = self._step(self.encoder, chunk, self.state, lengths)
        self.chunks += 1
        out = out[:, : int(out_lens.max())]  # (B, r, D)
        self.frames_out += out.shape[1]
        return out
