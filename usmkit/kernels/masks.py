"""The one chunk-wise attention mask definition that every attention implementation follows.

Semantics (B: batch, T: frames):

- ``chunk_size=None`` means full attention: every query sees every valid key.
- Otherwise frame ``t`` belongs to chunk ``t // chunk_size``. A query in chunk ``c`` sees the keys
  of chunk ``c`` (all of it, also frames after the query) and of the ``left_chunks`` chunks before
  it: ``left_chunks=0`` gives USM's disjoint chunks, ``left_chunks=-1`` all left context,
  ``left_chunks=k`` a streaming model's k chunks of history. Keys of later chunks are never seen.
- Keys at ``t >= lengths[b]`` are padding and never seen. Queries at ``t >= lengths[b]`` see
  nothing; every implementation returns 0 for them (and passes no gradient through them).

Packed rows (several utterances per row, ``usmkit.data.packing``) describe their frames with ``Segments``
instead of ``lengths``: the same rule holds inside each utterance, with chunks counted from the utterance's
own first frame, and no frame ever sees another utterance's (``segment_chunk_mask``). One utterance per row
is the special case ``Segments.from_lengths``: the two descriptions give the same mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def check_chunk_args(chunk_size: int | None, left_chunks: int) -> None:
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of frames or None (full), got {chunk_size}")
    if left_chunks < -1:
        raise ValueError(f"left_chunks must be -1 (all), 0 (disjoint) or k > 0, got {left_chunks}")


def chunk_mask(T: int, chunk_size: int | None, left_chunks: int, device=None) -> torch.Tensor:
    """Boolean (T, T) mask, True where query row ``i`` may attend to key column ``j``.

    >>> chunk_mask(4, chunk_size=2, left_chunks=0).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    >>> chunk_mask(4, chunk_size=2, left_chunks=-1).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    """
    check_chunk_args(chunk_size, left_chunks)
    if chunk_size is None:
        return torch.ones(T, T, dtype=torch.bool, device=device)
    chunk = torch.arange(T, device=device) // chunk_size  # (T,)
    diff = chunk[:, None] - chunk[None, :]  # (T, T): query chunk - key chunk
    allowed = diff >= 0
    if left_chunks >= 0:
        allowed &= diff <= left_chunks
    return allowed


def padded_chunk_mask(lengths: torch.Tensor, T: int, chunk_size: int | None, left_chunks: int) -> torch.Tensor:
    """Boolean (B, T, T) mask: ``chunk_mask`` restricted to valid keys and valid queries.

    Rows of padded queries are all False (those queries attend to nothing).
    """
    valid = torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
    mask = chunk_mask(T, chunk_size, left_chunks, device=lengths.device)  # (T, T)
    return mask[None] & valid[:, None, :] & valid[:, :, None]  # (B, T, T)


def lengths_to_padding_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool, True at padded frames (``t >= lengths[b]``)."""
    return torch.arange(T, device=lengths.device)[None, :] >= lengths[:, None]


@dataclass(frozen=True)
class Segments:
    """Which utterance each frame of a packed row belongs to, and where in it (B rows, T frames).

    ``ids`` (B, T) int64: the utterance's index in the batch, -1 at padding (also between utterances).
    Utterances are numbered row by row, left to right, so the ids never decrease along a row (padding aside).
    ``positions`` (B, T) int64: the frame's index counted from its utterance's first frame (0 at padding).
    """

    ids: torch.Tensor
    positions: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        """(B, T) bool, True at the frames of an utterance."""
        return self.ids >= 0

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, T: int) -> Segments:
        """One utterance per row of ``lengths`` (B,) valid frames: utterance b is row b."""
        t = torch.arange(T, device=lengths.device)[None, :]  # (1, T)
        valid = t < lengths[:, None]  # (B, T)
        rows = torch.arange(lengths.shape[0], device=lengths.device)[:, None]  # (B, 1)
        return cls(torch.where(valid, rows, -1), torch.where(valid, t, 0))


def segment_chunk_mask(segments: Segments, chunk_size: int | None, left_chunks: int) -> torch.Tensor:
    """Boolean (B, T, T) mask of packed rows: query ``i`` sees key ``j`` when both are frames of one utterance
    and the chunk rule allows it, chunks counted from that utterance's start. Padded queries see nothing.

    >>> seg = Segments(torch.tensor([[0, 0, 0, 1, 1, -1]]), torch.tensor([[0, 1, 2, 0, 1, 0]]))
    >>> segment_chunk_mask(seg, chunk_size=2, left_chunks=0)[0].int().tolist()
    [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]]
    """
    check_chunk_args(chunk_size, left_chunks)
    ids, valid = segments.ids, segments.valid
    allowed = (ids[:, :, None] == ids[:, None, :]) & valid[:, :, None]  # (B, T, T): one utterance
    if chunk_size is not None:
        chunk = segments.positions // chunk_size  # (B, T) chunk within the utterance
        diff = chunk[:, :, None] - chunk[:, None, :]  # (B, T, T): query chunk - key chunk
        allowed &= diff >= 0
        if left_chunks >= 0:
            allowed &= diff <= left_chunks
    return allowed


Frames = torch.Tensor | Segments  # (B,) valid frames per row (one utterance each), or packed rows' Segments


def frames_mask(frames: Frames, T: int, chunk_size: int | None, left_chunks: int) -> torch.Tensor:
    """Boolean (B, T, T) attention mask of either description of a batch's frames."""
    if isinstance(frames, Segments):
        return segment_chunk_mask(frames, chunk_size, left_chunks)
    return padded_chunk_mask(frames, T, chunk_size, left_chunks)


def frames_padding(frames: Frames, T: int) -> torch.Tensor:
    """(B, T) bool, True at padded frames, of either description of a batch's frames."""
    if isinstance(frames, Segments):
        return ~frames.valid
    return lengths_to_padding_mask(frames, T)
