"""Chunk-wise attention through FlexAttention (``torch.nn.attention.flex_attention``).

Shapes: B batch, H heads, T frames, D head dim. q, k, v: (B, H, T, D); lengths: (B,) int (or packed rows'
``Segments``);
nq = nk = ceil(T / BLOCK_SIZE) blocks of queries and keys.
Mask semantics: ``usmkit.kernels.masks`` (the same as ``reference.py``, which this is tested against):
the ``mask_mod`` below is the chunk rule written with chunk index arithmetic plus the lengths.

Block mask: instead of ``create_block_mask`` (which evaluates ``mask_mod`` on every (q, k) pair)
the block layout is computed in closed form from the chunk ranges of each block and the lengths:
O(B * nq * nk) small tensor ops, no host sync, so it works under ``torch.compile`` and costs less
than a cache would (a cache keyed by lengths needs their values on the host, i.e. a device sync
per call). Blocks whose every pair is allowed are "full" (``mask_mod`` skipped); blocks that are
partly allowed are "partial"; the rest are skipped.

Packed rows (``Segments``): the tiles follow from each block's range of utterance ids (ids never decrease
along a row, so two blocks share an utterance only where their ranges meet) and, for two blocks inside one
utterance, from their chunk ranges; ``segment_block_layout``. The layout may call a tile partial that
holds no allowed pair (``mask_mod`` then masks it all), never the other way round.

Padded query rows see no key; FlexAttention returns 0 for such rows and we zero them once more,
so they pass no gradient. Devices: on CUDA the fused kernel is used (``torch.compile``-d here unless
the caller is already being compiled). On CPU torch 2.11 has no FlexAttention backward; the forward
runs the eager (unfused, dense) implementation, meant for tests and small inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.kernels.masks import Frames, Segments, check_chunk_args, frames_padding

BLOCK_SIZE = 128  # FlexAttention's default sparse block size (queries and keys)

_compiled_flex = None  # torch.compile(flex_attention), built on first CUDA use


def _flex_fn(device_type: str):
    """The flex_attention callable to use: fused (compiled) on accelerators, eager on CPU."""
    global _compiled_flex
    if device_type == "cpu" or torch.compiler.is_compiling():
        # An enclosing torch.compile fuses it anyway; on CPU the eager path spares a slow compile.
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def chunk_block_layout(
    lengths: torch.Tensor, T: int, chunk_size: int | None, left_chunks: int, block_size: int = BLOCK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (query block, key block) tiles need computing: (partial, full), each (B, nq, nk) bool.

    ``full``: every (q, k) pair in the tile is allowed; ``partial``: some but not all pairs may be allowed
    (``mask_mod`` decides per pair). A tile in neither is skipped.
    """
    check_chunk_args(chunk_size, left_chunks)
    n = (T + block_size - 1) // block_size
    start = torch.arange(n, device=lengths.device) * block_size  # (n,) first frame of each block
    end = torch.clamp(start + block_size, max=T) - 1  # (n,) last frame of each block
    if chunk_size is None:
        some = torch.ones(n, n, dtype=torch.bool, device=lengths.device)  # (nq, nk)
        every = some
    else:
        lo, hi = start // chunk_size, end // chunk_size  # (n,) chunk range of each block
        # The chunk differences (query chunk - key chunk) in a tile form the whole range [d_min, d_max].
        d_max = hi[:, None] - lo[None, :]  # (nq, nk)
        d_min = lo[:, None] - hi[None, :]  # (nq, nk)
        some, every = d_max >= 0, d_min >= 0
        if left_chunks >= 0:
            some = some & (d_min <= left_chunks)
            every = every & (d_max <= left_chunks)
    lengths = lengths[:, None]  # (B, 1)
    touches_valid = start[None, :] < lengths  # (B, n) block holds a valid frame
    all_valid = end[None, :] < lengths  # (B, n) every frame of the block is valid
    some = some[None] & touches_valid[:, :, None] & touches_valid[:, None, :]  # (B, nq, nk)
    every = every[None] & all_valid[:, :, None] & all_valid[:, None, :]  # (B, nq, nk)
    return some & ~every, every


def segment_block_layout(
    segments: Segments, chunk_size: int | None, left_chunks: int, block_size: int = BLOCK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_block_layout`` of packed rows: (partial, full), each (B, nq, nk) bool.

    ``full`` tiles are exact (both blocks inside one utterance, every pair allowed); ``partial`` holds every
    other tile that may hold an allowed pair: the blocks' utterance-id ranges meet and, where both blocks lie
    inside one utterance, their chunk ranges allow it.
    """
    check_chunk_args(chunk_size, left_chunks)
    B, T = segments.ids.shape
    n = (T + block_size - 1) // block_size
    pad = n * block_size - T
    ids = F.pad(segments.ids, (0, pad), value=-1).view(B, n, block_size)  # (B, n, bs)
    valid = ids >= 0
    inside = (torch.arange(n * block_size, device=ids.device) < T).view(n, block_size)  # (n, bs) frames < T
    big = torch.iinfo(ids.dtype).max
    lo = torch.where(valid, ids, big).amin(-1)  # (B, n) smallest utterance id in the block
    hi = torch.where(valid, ids, -1).amax(-1)  # (B, n) largest
    touches = valid.any(-1)  # (B, n) block holds a valid frame
    whole = (valid | ~inside).all(-1)  # (B, n) every frame of the block (below T) is valid
    single = touches & (lo == hi)  # (B, n) inside one utterance
    meet = torch.maximum(lo[:, :, None], lo[:, None, :]) <= torch.minimum(hi[:, :, None], hi[:, None, :])
    some = touches[:, :, None] & touches[:, None, :] & meet  # (B, nq, nk)
    same = single[:, :, None] & single[:, None, :] & (lo[:, :, None] == lo[:, None, :])  # (B, nq, nk)
    every = same & whole[:, :, None] & whole[:, None, :]
    if chunk_size is not None:
        chunk = F.pad(segments.positions, (0, pad)).view(B, n, block_size) // chunk_size  # (B, n, bs)
        c_lo = torch.where(valid, chunk, big).amin(-1)  # (B, n)
        c_hi = torch.where(valid, chunk, -1).amax(-1)
        d_max = c_hi[:, :, None] - c_lo[:, None, :]  # (B, nq, nk): query chunk - key chunk, largest
        d_min = c_lo[:, :, None] - c_hi[:, None, :]  # smallest
        reach, all_reach = d_max >= 0, d_min >= 0
        if left_chunks >= 0:
            reach, all_reach = reach & (d_min <= left_chunks), all_reach & (d_max <= left_chunks)
        some = some & (~same | reach)  # chunk ranges decide only inside one utterance
        every = every & all_reach
    return some & ~every, every


def _ordered(layout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (B, nq, nk) tile layout -> BlockMask's (num_blocks (B, 1, nq), indices (B, 1, nq, nk)) int32."""
    num = layout.sum(dim=-1, dtype=torch.int32)  # (B, nq)
    # Stable sort puts the selected key blocks first, in increasing order.
    idx = torch.argsort(layout.to(torch.int8), dim=-1, descending=True, stable=True)  # (B, nq, nk)
    return num[:, None], idx.to(torch.int32)[:, None]


def chunk_block_mask(
    lengths: Frames, T: int, chunk_size: int | None, left_chunks: int, block_size: int = BLOCK_SIZE
) -> BlockMask:
    """The FlexAttention BlockMask of the chunk rule for this batch (broadcast over heads)."""
    if isinstance(lengths, Segments):
        return _segment_block_mask(lengths, T, chunk_size, left_chunks, block_size)

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (q_idx < lengths[b]) & (kv_idx < lengths[b])
        if chunk_size is not None:
            diff = q_idx // chunk_size - kv_idx // chunk_size  # query chunk - key chunk
            allowed = allowed & (diff >= 0)
            if left_chunks >= 0:
                allowed = allowed & (diff <= left_chunks)
        return allowed

    partial, full = chunk_block_layout(lengths, T, chunk_size, left_chunks, block_size)
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(T, T)
    )


def _segment_block_mask(
    segments: Segments, T: int, chunk_size: int | None, left_chunks: int, block_size: int
) -> BlockMask:
    ids, positions = segments.ids, segments.positions

    def mask_mod(b, h, q_idx, kv_idx):
        query = ids[b, q_idx]
        allowed = (query == ids[b, kv_idx]) & (query >= 0)
        if chunk_size is not None:
            diff = positions[b, q_idx] // chunk_size - positions[b, kv_idx] // chunk_size
            allowed = allowed & (diff >= 0)
            if left_chunks >= 0:
                allowed = allowed & (diff <= left_chunks)
        return allowed

    partial, full = segment_block_layout(segments, chunk_size, left_chunks, block_size)
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(T, T)
    )


def chunk_attention_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: Frames,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
    bias: RelativeKeyBias | None = None,
) -> torch.Tensor:
    """FlexAttention under the chunk mask, plus ``bias`` (a ``score_mod``) where given; rows of padded queries
    are 0. Returns (B, H, T, D)."""
    B, H, T, D = q.shape
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError(
            "attention_impl='flex' cannot train on CPU: torch 2.11 has no FlexAttention backward on CPU. "
            "Use attention_impl='sdpa' (or 'reference') on CPU, or run flex under torch.no_grad()."
        )
    block_mask = chunk_block_mask(lengths, T, chunk_size, left_chunks)
    score_mod = None if bias is None else bias.score_mod()
    out = _flex_fn(q.device.type)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)  # (B, H, T, D)
    padded = frames_padding(lengths, T)  # (B, T)
    return out.masked_fill(padded[:, None, :, None], 0.0)  # (B, H, T, D)
