"""BEST-RQ span masking: worked examples, clipping, and the statistics the config promises."""

import math

import pytest
import torch

from usmkit.ssl.bestrq import BestRQConfig
from usmkit.ssl.masking import (
    ensure_one_start,
    expand_spans,
    mask_packed_spans,
    mask_spans,
    sample_span_starts,
    valid_mask,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _runs(row: torch.Tensor) -> list[tuple[int, int]]:
    """(start, length) of every run of True in a 1-d bool tensor (slow, test-only oracle)."""
    runs, start = [], None
    for t, v in enumerate(row.tolist() + [False]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            runs.append((start, t - start))
            start = None
    return runs


def test_expand_spans_worked_example():
    starts = torch.tensor([[0, 1, 0, 0, 0, 0, 1, 0]], dtype=torch.bool)
    assert expand_spans(starts, span=3).int().tolist() == [[0, 1, 1, 1, 0, 0, 1, 1]]
    assert expand_spans(starts, span=1).equal(starts)


def test_expand_spans_overlaps_merge_and_clip_at_length():
    starts = torch.zeros(2, 12, dtype=torch.bool)
    starts[0, [1, 3]] = True  # overlapping spans of 4: frames 1..6
    starts[1, 8] = True  # span 8..11, clipped to the length 10: frames 8, 9
    valid = valid_mask(torch.tensor([12, 10]), 12)
    got = expand_spans(starts, span=4, valid=valid)
    assert torch.nonzero(got[0]).flatten().tolist() == [1, 2, 3, 4, 5, 6]
    assert torch.nonzero(got[1]).flatten().tolist() == [8, 9]


def test_expand_spans_matches_a_loop_oracle():
    g = _gen(3)
    starts = torch.rand(4, 50, generator=g) < 0.1
    span = 5
    want = torch.zeros_like(starts)
    for b, t in torch.nonzero(starts).tolist():
        want[b, t : t + span] = True
    assert expand_spans(starts, span).equal(want)


def test_expand_spans_rejects_bad_span():
    with pytest.raises(ValueError, match="span must be >= 1"):
        expand_spans(torch.zeros(1, 4, dtype=torch.bool), span=0)


def test_span_frames_from_milliseconds():
    assert BestRQConfig().span_frames == 40
    assert BestRQConfig(mask_span_ms=200.0, frame_shift_ms=20.0).span_frames == 10


def test_start_fraction_matches_mask_prob():
    p = 0.01
    valid = torch.ones(64, 2000, dtype=torch.bool)
    starts = sample_span_starts(valid, p, _gen(0))
    n = valid.numel()
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(starts.sum().item() - n * p) < 5 * sigma


def test_masked_fraction_matches_formula_and_spans_have_configured_length():
    cfg = BestRQConfig()  # p = 0.01, span 400 ms / 10 ms = 40 frames
    L = cfg.span_frames
    B, T = 64, 4000
    mask = mask_spans(torch.full((B,), T), T, cfg, _gen(1))
    # Frames t >= L - 1 can be reached by L possible starts: P(masked) = 1 - (1 - p)^L.
    expected = 1 - (1 - cfg.mask_prob) ** L
    interior = mask[:, L - 1 :].float().mean().item()
    assert abs(interior - expected) < 0.02, (interior, expected)
    # Every run is a union of whole spans: at least L frames unless clipped at the end, and isolated
    # spans (the common case at p = 0.01) are exactly L long.
    lengths = [length for row in mask[:8] for start, length in _runs(row) if start + length < T]
    assert min(lengths) == L
    assert sum(length == L for length in lengths) > len(lengths) / 2


def test_mask_spans_is_the_composition_of_starts_and_spans():
    cfg = BestRQConfig(mask_prob=0.05, mask_span_ms=50.0)
    lengths = torch.tensor([100, 37, 0])
    got = mask_spans(lengths, 100, cfg, _gen(7))
    valid = valid_mask(lengths, 100)
    g = _gen(7)
    starts = ensure_one_start(sample_span_starts(valid, cfg.mask_prob, g), lengths, g)
    assert got.equal(expand_spans(starts, cfg.span_frames, valid))
    plain = mask_spans(lengths, 100, BestRQConfig(mask_prob=0.05, mask_span_ms=50.0, min_one_span=False), _gen(7))
    assert plain.equal(expand_spans(sample_span_starts(valid, cfg.mask_prob, _gen(7)), cfg.span_frames, valid))


def test_ensure_one_start_fills_only_rows_without_a_start():
    starts = torch.zeros(4, 10, dtype=torch.bool)
    starts[0, 3] = True
    lengths = torch.tensor([10, 4, 0, 10])
    got = ensure_one_start(starts, lengths, _gen(0))
    assert got[0].equal(starts[0])  # already had one
    assert got[1].sum() == 1 and got[1, :4].any()  # one, inside the length
    assert not got[2].any()  # empty utterance stays empty
    assert got[3].sum() == 1
    # Over many draws the forced start is uniform over the valid frames.
    many = ensure_one_start(torch.zeros(4000, 10, dtype=torch.bool), torch.full((4000,), 5), _gen(1))
    counts = many.sum(dim=0)
    assert counts[5:].sum() == 0 and counts[:5].min() > 700


def test_min_one_span_masks_every_short_utterance():
    lengths = torch.full((500,), 50)
    on = mask_spans(lengths, 50, BestRQConfig(mask_prob=0.001), _gen(0))
    off = mask_spans(lengths, 50, BestRQConfig(mask_prob=0.001, min_one_span=False), _gen(0))
    assert on.any(dim=1).all()
    assert (~off.any(dim=1)).sum() > 400  # 0.999^50 = 95% of rows draw no span on their own


def test_padding_is_never_masked():
    cfg = BestRQConfig(mask_prob=0.5)
    lengths = torch.tensor([30, 10, 0])
    mask = mask_spans(lengths, 30, cfg, _gen(0))
    assert not mask[1, 10:].any() and not mask[2].any()
    assert mask[0].any()


def test_masks_are_reproducible_for_a_generator_seed():
    cfg = BestRQConfig(mask_prob=0.05)
    lengths = torch.tensor([200, 150])
    a = mask_spans(lengths, 200, cfg, _gen(11))
    b = mask_spans(lengths, 200, cfg, _gen(11))
    c = mask_spans(lengths, 200, cfg, _gen(12))
    assert a.equal(b)
    assert not a.equal(c)


# ---- packed rows: spans per utterance


def test_expand_spans_stop_at_the_end_of_each_packed_utterance():
    """Two utterances (frames 0-4, 5-9) in one row: a span started at frame 3 stops at frame 4."""
    starts = torch.tensor([[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])
    assert expand_spans(starts, span=4).int().tolist() == [[0, 0, 0, 1, 1, 1, 1, 0, 0, 0]]
    assert expand_spans(starts, span=4, positions=positions).int().tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 0, 0]]
    t = torch.arange(10)[None, :]
    many = torch.rand(3, 10, generator=_gen(0)) < 0.3
    assert torch.equal(expand_spans(many, 3, positions=t.expand(3, 10)), expand_spans(many, 3)), "one per row"


def test_packed_masks_cover_each_utterance_alone():
    """Every utterance of a packed row gets a span (min_one_span) inside itself; padding stays unmasked."""
    ids = torch.tensor([[0, 0, 0, 0, -1, 1, 1, 1, 1, 1, 1, -1], [2, 2, 2, 2, 2, 2, 2, 2, -1, -1, -1, -1]])
    rows, offsets, lengths = torch.tensor([0, 0, 1]), torch.tensor([0, 5, 0]), torch.tensor([4, 6, 8])
    positions = torch.where(ids >= 0, torch.arange(12)[None, :] - offsets[ids.clamp(min=0)], 0)
    cfg = BestRQConfig(mask_prob=1e-6, mask_span_ms=30.0)  # starts come from min_one_span alone
    for seed in range(20):
        mask = mask_packed_spans(ids, positions, rows, offsets, lengths, cfg, _gen(seed))
        assert not mask[ids < 0].any()
        for u in range(3):
            own = mask[ids == u]
            assert own.any(), f"utterance {u} has no span"
            assert _runs(own)[0][1] <= 3 and len(_runs(own)) == 1, "one span of at most 3 frames"
