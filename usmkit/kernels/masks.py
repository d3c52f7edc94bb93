"""The one chunk-wise attention mask definition that every attention implementation follows.

Semantics (B: batch, T: frames):

- ``chunk_size=None`` means full attention: every query sees every valid key.
- Otherwise frame ``t`` belongs to chunk ``t // chunk_size``. A query in chunk ``c`` sees the keys
  of chunk ``c`` (all of it, also frames after the query) and of the ``left_chunks`` chunks before
  it: ``left_chunks=0`` gives USM's disjoint chunks, ``left_chunks=-1`` all left context,
  ``left_chunks=k`` a streaming model's k chunks of history. Keys of later chunks are never seen.
- Keys at ``t >= lengths[b]`` are padding and never seen. Queries at ``t >= lengths[b]`` see
  nothing; every implementation returns 0 for them (and passes no gradient through them).
"""

from __future__ import annotations

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
