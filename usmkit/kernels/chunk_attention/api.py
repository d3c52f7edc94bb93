"""Public entry point for chunk-wise attention: one signature, several implementations.

Shapes: B batch, H heads, T frames, D head dim. q, k, v: (B, H, T, D); lengths: (B,) int, or the
``Segments`` of packed rows (several utterances per row). Mask semantics: ``usmkit.kernels.masks``. Every
implementation is tested against ``reference``. The Triton kernels take packed rows as each frame's utterance
bounds (``segment_bounds``).

The Triton path is two ``torch.library`` custom ops, ``usmkit::chunk_attention_fwd`` (-> out, lse) and
``usmkit::chunk_attention_bwd`` (-> dq, dk, dv), with fake implementations and autograd registered here, so
``torch.compile(fullgraph=True)`` traces a model through them without a graph break and calls the kernels as
opaque ops. ``custom_op`` rather than ``triton_op`` + ``wrap_triton``: ``wrap_triton`` only takes compiled
``JITFunction``s, so it cannot run the CPU interpreter (TRITON_INTERPRET=1) the tests use.
In eager mode the same launchers run under a plain ``torch.autograd.Function`` instead: custom-op dispatch and
its autograd wrapper add host time to every forward + backward, which is most of the wall time at small sizes;
``torch.compile`` always sees the custom ops.
The kernel module is imported lazily, on the first call: TRITON_INTERPRET must be set before it is imported.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.kernels.masks import Frames, Segments, check_chunk_args

Impl = Literal["reference", "sdpa", "flex", "triton"]
IMPLS: tuple[str, ...] = ("reference", "sdpa", "flex", "triton")


def segment_bounds(segments: Segments) -> torch.Tensor:
    """Packed rows' ``Segments`` (B, T) -> each frame's utterance bounds (B, 2, T) int32: [start, end) frame indices
    in its row, 0 and 0 at padding. An utterance's frames are contiguous in its row: its end is one past the
    first frame at or after t whose next frame belongs elsewhere (a reversed running minimum). Tensor
    operations only, no host sync and no scatter (whose repeated targets serialize), so it runs inside compiled
    graphs."""
    ids, pos = segments.ids, segments.positions
    B, T = ids.shape
    t = torch.arange(T, device=ids.device).expand(B, T)  # (B, T)
    valid = ids >= 0
    following = F.pad(ids[:, 1:], (0, 1), value=-1)  # (B, T) the next frame's utterance
    last = torch.where(valid & (following != ids), t, T)  # (B, T) frames that end their utterance, else T
    end = last.flip(1).cummin(1).values.flip(1) + 1  # (B, T) one past the first utterance end at or after t
    start = torch.where(valid, t - pos, 0)
    return torch.stack([start, torch.where(valid, end, 0)], dim=1).to(torch.int32)  # (B, 2, T)


def _kernels():
    from usmkit.kernels.chunk_attention import triton as kernels

    return kernels


@torch.library.custom_op(
    "usmkit::chunk_attention_fwd",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor lengths, int? chunk_size, int left_chunks, float? scale)"
    " -> (Tensor, Tensor)",
)
def triton_chunk_attention_op(q, k, v, lengths, chunk_size, left_chunks, scale):
    """The Triton forward as a torch.library op: returns (out (B, H, T, D), lse (B, H, T) fp32, log2 units)."""
    return _kernels().chunk_attention_fwd(q, k, v, lengths, chunk_size, left_chunks, scale)


@triton_chunk_attention_op.register_fake
def triton_chunk_attention_op_fake(q, k, v, lengths, chunk_size, left_chunks, scale):
    B, H, T, D = q.shape
    return q.new_empty((B, H, T, D)), q.new_empty((B, H, T), dtype=torch.float32)  # out, lse (log2 units)


@torch.library.custom_op(
    "usmkit::chunk_attention_bwd",
    mutates_args=(),
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor lengths, int? chunk_size,"
    " int left_chunks, float? scale) -> (Tensor, Tensor, Tensor)",
)
def _triton_bwd(dout, q, k, v, out, lse, lengths, chunk_size, left_chunks, scale):
    return _kernels().chunk_attention_bwd(dout, q, k, v, out, lse, lengths, chunk_size, left_chunks, scale)


@_triton_bwd.register_fake
def _triton_bwd_fake(dout, q, k, v, out, lse, lengths, chunk_size, left_chunks, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, lengths, chunk_size, left_chunks, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, lengths)
    ctx.mask_args = (chunk_size, left_chunks, scale)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, lengths = ctx.saved_tensors
    dq, dk, dv = _triton_bwd(dout, q, k, v, out, lse, lengths, *ctx.mask_args)
    return dq, dk, dv, None, None, None, None


triton_chunk_attention_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerTritonAttention(torch.autograd.Function):
    """The same kernels as the custom ops, with less host time per call (see the module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, lengths, chunk_size, left_chunks, scale):
        out, lse = _kernels().chunk_attention_fwd(q, k, v, lengths, chunk_size, left_chunks, scale)
        ctx.save_for_backward(q, k, v, out, lse, lengths)
        ctx.mask_args = (chunk_size, left_chunks, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lengths = ctx.saved_tensors
        dq, dk, dv = _kernels().chunk_attention_bwd(dout, q, k, v, out, lse, lengths, *ctx.mask_args)
        return dq, dk, dv, None, None, None, None


def triton_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Differentiable Triton chunk attention: the custom op under torch.compile, an autograd.Function in eager."""
    if torch.compiler.is_compiling():
        out, _ = triton_chunk_attention_op(q, k, v, lengths, chunk_size, left_chunks, scale)
        return out
    return _EagerTritonAttention.apply(q, k, v, lengths, chunk_size, left_chunks, scale)


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: Frames,
    chunk_size: int | None,
    left_chunks: int,
    impl: Impl = "sdpa",
    bias: RelativeKeyBias | None = None,
) -> torch.Tensor:
    """Chunk-wise masked attention. Returns (B, H, T, D); rows of padded queries are 0.

    ``bias``: a relative-position score bias (imported encoders' positions); every implementation but
    ``triton`` (rotary positions only) takes it."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    check_chunk_args(chunk_size, left_chunks)
    if impl == "reference":
        from usmkit.kernels.chunk_attention.reference import chunk_attention_reference

        return chunk_attention_reference(q, k, v, lengths, chunk_size, left_chunks, bias=bias)
    if impl == "sdpa":
        from usmkit.kernels.chunk_attention.sdpa import chunk_attention_sdpa

        return chunk_attention_sdpa(q, k, v, lengths, chunk_size, left_chunks, bias=bias)
    if impl == "flex":
        from usmkit.kernels.chunk_attention.flex import chunk_attention_flex

        return chunk_attention_flex(q, k, v, lengths, chunk_size, left_chunks, bias=bias)
    if impl == "triton":
        if bias is not None:
            raise ValueError(
                "the Triton chunk-attention kernel takes rotary positions only, not a relative-position bias "
                "(position='relative_key'); use attention_impl='sdpa' or 'flex'"
            )
        frames = segment_bounds(lengths) if isinstance(lengths, Segments) else lengths
        return triton_chunk_attention(q, k, v, frames, chunk_size, left_chunks)
    raise ValueError(f"unknown attention impl {impl!r}; choose one of {IMPLS}")
