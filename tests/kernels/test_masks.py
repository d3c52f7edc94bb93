"""The one chunk-mask definition (usmkit.kernels.masks): worked examples, left context, padding, packed rows."""

import doctest

import pytest
import torch

from usmkit.kernels import masks
from usmkit.kernels.masks import (
    Segments,
    check_chunk_args,
    chunk_mask,
    frames_padding,
    lengths_to_padding_mask,
    padded_chunk_mask,
    segment_chunk_mask,
)


def test_doctests_hold():
    result = doctest.testmod(masks, verbose=False)
    assert result.attempted >= 2
    assert result.failed == 0


def test_left_chunks_k_keeps_k_chunks_of_history():
    got = chunk_mask(6, chunk_size=2, left_chunks=1).int().tolist()
    assert got == [
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
    ]


def test_chunk_size_not_dividing_T_gives_a_short_last_chunk():
    got = chunk_mask(5, chunk_size=2, left_chunks=0).int().tolist()
    assert got == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]


def test_full_and_large_chunks_agree():
    assert chunk_mask(7, None, 0).all()
    assert torch.equal(chunk_mask(7, 7, 0), chunk_mask(7, None, 0))
    assert torch.equal(chunk_mask(7, 100, 0), chunk_mask(7, None, -1))


def test_padding_rows_and_columns():
    lengths = torch.tensor([4, 3])
    mask = padded_chunk_mask(lengths, 4, chunk_size=2, left_chunks=-1)  # (B, T, T)
    assert mask.shape == (2, 4, 4)
    assert torch.equal(mask[0], chunk_mask(4, 2, -1))
    assert mask[1].int().tolist() == [
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],  # key 3 is padding
        [0, 0, 0, 0],  # query 3 is padding: sees nothing
    ]
    assert lengths_to_padding_mask(lengths, 4).int().tolist() == [[0, 0, 0, 0], [0, 0, 0, 1]]


def test_zero_length_row_sees_nothing():
    mask = padded_chunk_mask(torch.tensor([0, 2]), 2, chunk_size=None, left_chunks=0)
    assert not mask[0].any()
    assert mask[1].all()


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(0, 0), (-3, 0), (2, -2)])
def test_bad_chunk_args_raise(chunk_size, left_chunks):
    with pytest.raises(ValueError, match="chunk_size|left_chunks"):
        check_chunk_args(chunk_size, left_chunks)


# ---- packed rows (Segments)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (2, 0), (3, 1), (2, -1), (1, 2)])
def test_one_utterance_per_row_segments_give_the_padded_mask(chunk_size, left_chunks):
    lengths = torch.tensor([7, 4, 0])
    segments = Segments.from_lengths(lengths, 7)
    assert torch.equal(
        segment_chunk_mask(segments, chunk_size, left_chunks), padded_chunk_mask(lengths, 7, chunk_size, left_chunks)
    )
    assert torch.equal(frames_padding(segments, 7), lengths_to_padding_mask(lengths, 7))


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (2, 0), (3, 1), (2, -1)])
def test_packed_row_is_block_diagonal_with_chunks_from_each_utterance_start(chunk_size, left_chunks):
    """Two utterances (5 and 3 frames) and padding in one row: each block is that utterance's own mask,
    nothing crosses between them, padding sees and is seen by nothing."""
    ids = torch.tensor([[0, 0, 0, 0, 0, -1, 1, 1, 1, -1]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 0, 1, 2, 0]])
    mask = segment_chunk_mask(Segments(ids, positions), chunk_size, left_chunks)[0]  # (T, T)
    assert torch.equal(mask[:5, :5], chunk_mask(5, chunk_size, left_chunks))
    assert torch.equal(mask[6:9, 6:9], chunk_mask(3, chunk_size, left_chunks))
    outside = torch.ones(10, 10, dtype=torch.bool)
    outside[:5, :5] = False
    outside[6:9, 6:9] = False
    assert not mask[outside].any()
