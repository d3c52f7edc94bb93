"""Packed rows in the encoder: where each utterance's frames are, and back to one utterance per row.

Shapes: R rows, N feature frames per row, T' encoder frames per row, U utterances, s subsampling factor,
D model dim.

The batch's ``Packing`` (``usmkit.data.packing``) places utterance u at feature frame ``offsets[u]`` of row
``rows[u]``, a multiple of s. The conv2d front end has no padding, and its output frame ``a`` reads input
frames ``s a .. s a + 2 s - 2`` only (``usmkit.models.subsampling``), so utterance u's valid encoder frames
``offsets[u] / s + p`` (p < ``output_lengths(n_u)``) read its own feature frames only, the same frames
(and weights) as when it is alone in a row: the front end runs on the packed rows as they are, and
each utterance's frames come out exactly as they would alone. The alternatives cost more: running the front
end per utterance and packing its outputs needs a (U, T, F) batch of varying shape, and separating the
utterances by the receptive field (7 feature frames at 4x) wastes frames in every row. The encoder frames
between two utterances (an utterance's last ``s - 1`` feature frames and its slot's tail feed at most two
of them) are padding.
"""

from __future__ import annotations

import torch

from usmkit.data.packing import Packing
from usmkit.kernels.masks import Segments
from usmkit.models.subsampling import output_lengths


def feature_segments(packing: Packing) -> Segments:
    """The feature frames' ``Segments`` (R, N): each frame's utterance and its index in it."""
    ids = packing.segment_ids  # (R, N)
    t = torch.arange(ids.shape[1], device=ids.device)  # (N,)
    valid = ids >= 0
    positions = t[None, :] - packing.offsets[ids.clamp(min=0)]  # (R, N)
    return Segments(ids, torch.where(valid, positions, 0))


def encoder_segments(
    packing: Packing, lengths: torch.Tensor, factor: int, frames: int, front_end: str = "conv2d"
) -> Segments:
    """The encoder frames' ``Segments`` (R, T' = ``frames``) of a packed batch with (U,) feature ``lengths``.

    Encoder frame ``a`` starts at feature frame ``s a``: it belongs to that frame's utterance u when it is
    one of u's ``output_lengths(n_u)`` valid frames, i.e. ``s a - offsets[u] < s output_lengths(n_u)``.
    Static shapes, no host sync: gathers only.
    """
    ids = packing.segment_ids[:, : frames * factor : factor]  # (R, T') the utterance at feature frame s a
    if ids.shape[1] < frames:
        raise ValueError(f"packed rows of {packing.segment_ids.shape[1]} frames hold fewer than {frames} x {factor}")
    u = ids.clamp(min=0)  # (R, T')
    start = torch.arange(frames, device=ids.device) * factor  # (T',) feature frame of each encoder frame
    positions = torch.div(start[None, :] - packing.offsets[u], factor, rounding_mode="floor")  # (R, T')
    valid = (ids >= 0) & (positions < output_lengths(lengths, factor, front_end)[u])  # (R, T')
    return Segments(torch.where(valid, ids, -1), torch.where(valid, positions, 0))


def unpack(x: torch.Tensor, packing: Packing, lengths: torch.Tensor, factor: int) -> torch.Tensor:
    """x (R, T', ...) packed encoder frames -> (U, T', ...), utterance u's ``lengths[u]`` (U,) frames
    first in row u (from encoder frame ``offsets[u] / factor`` of its row), zeros after them.

    One gather of static shape (U, T'): every utterance is at most a row long. Its gradient is a gather too
    (``_GatherRows``).
    """
    R, T = x.shape[:2]
    U = lengths.shape[0]
    t = torch.arange(T, device=x.device)  # (T',)
    start = packing.rows * T + torch.div(packing.offsets, factor, rounding_mode="floor")  # (U,) flat index
    valid = t[None, :] < lengths[:, None]  # (U, T')
    index = torch.where(valid, start[:, None] + t[None, :], -1).flatten()  # (U T',) into x's frames, -1: zeros
    # Every packed frame is read by at most one unpacked frame: the inverse map sends it back (-1: nothing).
    # The unread frames all write -1 into one spare slot, so the scatter's duplicates agree.
    slot = torch.where(index >= 0, index, R * T)  # (U T',)
    source = torch.where(index >= 0, torch.arange(U * T, device=x.device), -1)  # (U T',)
    inverse = torch.full((R * T + 1,), -1, dtype=index.dtype, device=x.device).scatter(0, slot, source)[: R * T]
    out = _GatherRows.apply(x.reshape(R * T, *x.shape[2:]), index, inverse)  # (U T', ...)
    return out.view(U, T, *x.shape[2:])


def _take_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """src (N, ...), index (M,) in [-1, N) -> (M, ...): row ``index[m]`` of src, zeros where it is -1."""
    return torch.cat([src, src.new_zeros((1, *src.shape[1:]))])[index]  # -1 reads the appended zero row


class _GatherRows(torch.autograd.Function):
    """``_take_rows(src, index)`` where no row of src is read twice, and ``inverse`` (N,) names the output row
    that read each source row (-1: none). The gradient is then a gather as well: ``_take_rows(grad, inverse)``.
    Autograd's own gradient of ``src[index]`` is an accumulating ``index_put_``, which sorts the indices and
    serializes repeated ones (here every padded frame's), many times slower on a GPU.
    """

    @staticmethod
    def forward(ctx, src: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return _take_rows(src, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (inverse,) = ctx.saved_tensors
        return _take_rows(grad, inverse), None, None
