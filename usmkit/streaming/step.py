"""Chunk-by-chunk inference of the Conformer encoder with a fixed-shape state.

Shapes: B batch, T feature frames (10 ms), F feature bins, s subsampling factor (4 or 8), C chunk size
(encoder frames, 10 s ms), K left chunks, L layers, H heads, Dh head dim, D model dim, Kc conv kernel.

One ``stream_step`` turns the next ``s C`` feature frames into the next ``C`` encoder frames, exactly
the frames ``ConformerEncoder.forward`` computes for those positions under the same chunk mask
(``chunk_size=C``, ``left_chunks=K``) with causal convolution. Each layer runs the block's own body
(``ConformerBlock.before_attention`` / ``after_attention``); only the attention differs, over the
cached keys and values. What it carries between chunks is ``EncoderStreamState``, tensors of
constant shape only:

- ``feat_ctx`` (B, s - 1, F): the subsampling reads input frames ``s t .. s t + 2 s - 2`` for output
  ``t`` (``4t .. 4t + 6`` at 4x), so the last s - 1 feature frames of one chunk (3, or 7 at 8x) are
  read again by the next. The stream therefore starts with ``init_state(encoder, first_frames)``
  holding the first s - 1 frames; each step then consumes s C new ones. Encoder output lags the
  feature input by these frames (30 ms, 70 ms at 8x); ``usmkit.streaming.encoder.StreamingEncoder.flush`` encodes the tail.
- ``kv`` (L, 2, B, H, K C, Dh): rotated keys and values of the K previous chunks per layer, rolled by
  ``cat([kv[..., C:, :], new], dim=-2)`` (same size every step), and ``cached`` (number of valid
  frames in it, < K C only during the first K chunks).
- ``conv_tail`` (L, B, Kc - 1, D): the last Kc - 1 inputs of each causal depthwise convolution
  (time before channels, as ``ConvolutionModule.depthwise`` takes its context).
- ``offset``: absolute index of the chunk's first encoder frame, for the rotary positions.

With a stacking front end (``ConformerConfig.front_end="stack"``, w2v-BERT 2.0's) two chunks read no feature
frame twice: ``feat_ctx`` is empty (B, 0, F) and output lags input by nothing. With ``position="relative_key"``
the keys are not rotated and each layer adds its clipped-distance bias (``MultiHeadSelfAttention.relative_bias``)
to the scores, the distances counted from the first cached frame (``key_offset = K C``): the same bias the full
forward adds, because a key's distance to a query is the same in both.

``cached`` and ``offset`` are scalars for a batch of streams that started together, or (B,) vectors,
one per row, for a batch of independent streams at different positions (``stack_states`` builds one
from per-stream states, ``split_state`` gives them back after the step): a server runs the chunks of
all its ready streams as one step.

Requirements (``check_streamable``): ``causal_conv=True``, a finite ``chunk_size`` and
``left_chunks >= 0``. ``left_chunks=-1`` (unbounded history) is refused unless the caller passes an
explicit cap, which is then an approximation of the trained model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.rotary import RotaryTable
from usmkit.models.subsampling import feature_context


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
    if cfg.front_end == "dw_striding":
        raise NotStreamableError(
            "the encoder's front end is NeMo's dw_striding subsampling (an imported NEST / FastConformer), whose "
            "padded convolutions read ahead across chunk edges: it does not stream"
        )
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


STATE_TENSORS: tuple[str, ...] = (
    "kv",
    "cached",
    "conv_tail",
    "feat_ctx",
    "offset",
)  # a state's tensor fields, in order


@dataclass(frozen=True)
class EncoderStreamState:
    """What ``stream_step`` carries from one chunk to the next; every tensor keeps its shape for the whole stream."""

    kv: torch.Tensor  # (L, 2, B, H, K * C, Dh) rotated keys (0) and values (1) of the K previous chunks
    cached: torch.Tensor  # () or (B,) long: valid frames at the end of kv's time axis, 0 .. K * C
    conv_tail: torch.Tensor  # (L, B, Kc - 1, D) last inputs of each layer's causal depthwise convolution
    feat_ctx: torch.Tensor  # (B, s - 1, F) the last s - 1 feature frames consumed, read again by the next chunk
    offset: torch.Tensor  # () or (B,) long: absolute encoder frame index of the next chunk's first frame
    chunk_size: int
    left_chunks: int
    subsampling_factor: int  # s: feature frames per encoder frame (the encoder's)

    @property
    def batch_size(self) -> int:
        return self.feat_ctx.shape[0]

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The state's tensors in ``STATE_TENSORS`` order, as graphs that take plain tensors (traced, exported) see them."""
        return tuple(getattr(self, name) for name in STATE_TENSORS)

    def with_tensors(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> EncoderStreamState:
        """This state's geometry with ``tensors`` (``STATE_TENSORS`` order), e.g. a graph's new state."""
        return replace(self, **dict(zip(STATE_TENSORS, tensors, strict=True)))

    @property
    def chunk_input_frames(self) -> int:
        """Feature frames one ``stream_step`` consumes: s C."""
        return self.subsampling_factor * self.chunk_size

    @property
    def feature_context(self) -> int:
        """Feature frames carried from one chunk to the next: s - 1 (conv subsampling), 0 (stacking)."""
        return self.feat_ctx.shape[1]


def init_state(
    encoder: ConformerEncoder,
    first_frames: torch.Tensor,
    chunk_size: int | None = None,
    left_chunks: int | None = None,
) -> EncoderStreamState:
    """The state before the first chunk: empty caches and the stream's first ``feature_context`` feature
    frames (B, s - 1, F) (none with a stacking front end).

    ``chunk_size`` / ``left_chunks`` default to the encoder config's (see ``check_streamable``).
    """
    cfg = encoder.cfg
    C, K = check_streamable(cfg, chunk_size, left_chunks)
    context = feature_context(cfg.subsampling_factor, cfg.front_end)
    if first_frames.dim() != 3 or first_frames.shape[1:] != (context, cfg.input_dim):
        raise ValueError(
            f"first_frames must be the stream's first (B, {context}, {cfg.input_dim}) feature frames, "
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
        subsampling_factor=cfg.subsampling_factor,
    )


def chunk_lengths(chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor | None) -> torch.Tensor:
    """Check that chunk (B, s C, F) fits ``state``; the chunk's valid frames (B,), all s C when ``lengths`` is None."""
    B, Tc, Fb = chunk.shape
    if Tc != state.chunk_input_frames or (B, Fb) != (state.batch_size, state.feat_ctx.shape[2]):
        raise ValueError(
            f"chunk must be (B={state.batch_size}, {state.subsampling_factor} x chunk_size = {state.chunk_input_frames}, "
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
    """Encode the next chunk: chunk (B, s C, F) feature frames -> (out (B, C, D), out_lens (B,), new state).

    ``lengths`` (B,): valid feature frames of the chunk (default all s C). A chunk with fewer is the
    last one of its stream (its frames after the valid ones are padding): ``out_lens`` then counts the
    valid output frames, the rest of ``out`` is 0. Call ``encoder.eval()`` first.
    """
    C, K, s = state.chunk_size, state.left_chunks, state.subsampling_factor
    if s != encoder.subsampling_factor:
        raise ValueError(f"the state is of a {s}x stream, the encoder subsamples {encoder.subsampling_factor}x")
    B = chunk.shape[0]
    lengths = chunk_lengths(chunk, state, lengths)
    context = state.feature_context
    frames = torch.cat([state.feat_ctx, chunk], dim=1)  # (B, s - 1 + s C, F)
    x, _ = encoder.subsampling(frames, lengths + context)  # (B, C, D)
    out_lens = encoder.output_lengths(lengths + context)  # (B,) <= C
    valid = torch.arange(C, device=x.device)[None, :] < out_lens[:, None]  # (B, C)
    positions = state.offset[..., None] + torch.arange(C, device=x.device)  # (C,) or (B, C) absolute frame indices
    rotary: torch.Tensor | RotaryTable = positions  # relative_key: the keys take no positions
    if encoder.cfg.position == "rotary":
        rotary = RotaryTable.build(positions, encoder.cfg.head_dim, encoder.cfg.rotary_base)  # once for all layers
    # Keys: K C cached frames (the last `cached` of them valid), then this chunk's valid frames.
    cache_valid = torch.arange(K * C, device=x.device) >= K * C - state.cached[..., None]  # (K C,) or (B, K C)
    key_valid = torch.cat([cache_valid.expand(B, K * C), valid], dim=1)  # (B, K C + C)
    # A row without any valid key (a finished row of a batch) attends to all: finite garbage, discarded.
    key_valid = key_valid | ~key_valid.any(dim=1, keepdim=True)
    attn_mask = key_valid[:, None, None, :]  # (B, 1, 1, K C + C)

    new_kv, new_tails = [], []
    for layer, block in enumerate(encoder.blocks):
        x, q, k, v = block.before_attention(x, rotary)  # (B, C, D); (B, H, C, Dh) each
        keys = torch.cat([state.kv[layer, 0], k], dim=2)  # (B, H, K C + C, Dh)
        values = torch.cat([state.kv[layer, 1], v], dim=2)  # (B, H, K C + C, Dh)
        mask: torch.Tensor = attn_mask
        bias = block.mhsa.relative_bias(q, key_offset=K * C)  # None for rotary positions
        if bias is not None:  # (B, H, C, K C + C): the clipped-distance bias where allowed, -inf elsewhere
            mask = bias.dense(K * C + C).masked_fill(~attn_mask, float("-inf"))
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, H, C, Dh)
        tail = state.conv_tail[layer]  # (B, Kc - 1, D)
        x, conv_in = block.after_attention(x, attn, valid, conv_context=tail)  # (B, C, D) each
        new_kv.append(torch.stack([keys[:, :, C:], values[:, :, C:]]))  # (2, B, H, K C, Dh): roll by C
        seen = torch.cat([tail, conv_in], dim=1)  # (B, Kc - 1 + C, D)
        new_tails.append(seen[:, seen.shape[1] - tail.shape[1] :])  # (B, Kc - 1, D)

    new_state = EncoderStreamState(
        kv=torch.stack(new_kv),  # (L, 2, B, H, K C, Dh)
        cached=(state.cached + C).clamp(max=K * C),
        conv_tail=torch.stack(new_tails),  # (L, B, Kc - 1, D)
        feat_ctx=frames[:, frames.shape[1] - context :],  # (B, s - 1, F)
        offset=state.offset + C,
        chunk_size=C,
        left_chunks=K,
        subsampling_factor=s,
    )
    return x.masked_fill(~valid[:, :, None], 0.0), out_lens, new_state


def stack_states(states: list[EncoderStreamState]) -> EncoderStreamState:
    """One state for the rows of ``states`` in order (each of batch size 1 or more), with per-row
    ``cached`` and ``offset`` (B,), so that streams at different positions run as one ``stream_step``."""
    if not states:
        raise ValueError("stack_states needs at least one state")
    C, K, f = states[0].chunk_size, states[0].left_chunks, states[0].subsampling_factor
    if any((s.chunk_size, s.left_chunks, s.subsampling_factor) != (C, K, f) for s in states):
        masks = sorted({(s.chunk_size, s.left_chunks, s.subsampling_factor) for s in states})
        raise ValueError(f"states of one batch must share chunk_size, left_chunks and subsampling_factor, got {masks}")

    def rows(s: EncoderStreamState, t: torch.Tensor) -> torch.Tensor:
        return t.expand(s.batch_size) if t.dim() == 0 else t  # (B_i,)

    return EncoderStreamState(
        kv=torch.cat([s.kv for s in states], dim=2),  # (L, 2, B, H, K C, Dh)
        cached=torch.cat([rows(s, s.cached) for s in states]),  # (B,)
        conv_tail=torch.cat([s.conv_tail for s in states], dim=1),  # (L, B, Kc - 1, D)
        feat_ctx=torch.cat([s.feat_ctx for s in states]),  # (B, s - 1, F)
        offset=torch.cat([rows(s, s.offset) for s in states]),  # (B,)
        chunk_size=C,
        left_chunks=K,
        subsampling_factor=f,
    )


def split_state(state: EncoderStreamState) -> list[EncoderStreamState]:
    """The rows of a batched state, each a state of batch size 1 (``cached`` / ``offset`` of shape (1,))."""
    B = state.batch_size
    cached = state.cached.expand(B) if state.cached.dim() == 0 else state.cached  # (B,)
    offset = state.offset.expand(B) if state.offset.dim() == 0 else state.offset  # (B,)
    return [
        EncoderStreamState(
            kv=state.kv[:, :, b : b + 1],  # (L, 2, 1, H, K C, Dh)
            cached=cached[b : b + 1],
            conv_tail=state.conv_tail[:, b : b + 1],  # (L, 1, Kc - 1, D)
            feat_ctx=state.feat_ctx[b : b + 1],  # (1, s - 1, F)
            offset=offset[b : b + 1],
            chunk_size=state.chunk_size,
            left_chunks=state.left_chunks,
            subsampling_factor=state.subsampling_factor,
        )
        for b in range(B)
    ]
