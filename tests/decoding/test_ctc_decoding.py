"""CTC greedy and prefix beam search: hand-built cases, brute force, streaming."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from usmkit.decoding import (
    PrefixBeamState,
    ctc_greedy,
    ctc_greedy_hypotheses,
    ctc_prefix_beam_search,
    ctc_prefix_beam_search_batch,
)


def peaky(ids: list[int], V: int, peak: float = 8.0, noise: float = 0.0, seed: int = 0) -> torch.Tensor:
    """(T, V) log-probs whose argmax at frame t is ids[t]."""
    g = torch.Generator().manual_seed(seed)
    logits = noise * torch.randn(len(ids), V, generator=g) + peak * torch.nn.functional.one_hot(torch.tensor(ids), V)
    return logits.log_softmax(dim=-1)


def brute_force(log_probs: torch.Tensor, blank: int = 0) -> dict[tuple[int, ...], float]:
    """Exact log P(labels) for every label sequence: log-sum over all V^T alignments that collapse to it."""
    T, V = log_probs.shape
    lp = log_probs.double().tolist()
    totals: dict[tuple[int, ...], list[float]] = {}
    for path in itertools.product(range(V), repeat=T):
        labels, prev = [], None
        for c in path:
            if c != blank and c != prev:
                labels.append(c)
            prev = c
        totals.setdefault(tuple(labels), []).append(sum(lp[t][c] for t, c in enumerate(path)))
    return {k: torch.logsumexp(torch.tensor(v, dtype=torch.float64), dim=0).item() for k, v in totals.items()}


# ------------------------------------------------------------------------ greedy


def test_greedy_collapses_repeats_and_drops_blanks():
    # frames: 1 1 _ 1 2 2 _ _ 3 3   ->  1 1 2 3   (a blank separates the repeated 1s)
    lp = peaky([1, 1, 0, 1, 2, 2, 0, 0, 3, 3], V=5)[None]
    assert ctc_greedy(lp, torch.tensor([10])) == [[1, 1, 2, 3]]


def test_greedy_batch_respects_lengths():
    a = peaky([2, 2, 2, 4, 0, 4], V=5)
    b = peaky([0, 0, 3, 1, 1, 1], V=5)
    lp = torch.stack([a, b])  # (2, 6, 5)
    assert ctc_greedy(lp, torch.tensor([6, 6])) == [[2, 4, 4], [3, 1]]
    assert ctc_greedy(lp, torch.tensor([3, 2])) == [[2], []]  # frames past the length are ignored
    assert ctc_greedy(peaky([0, 0, 0], V=5)[None], torch.tensor([3])) == [[]]


def test_greedy_hypotheses_timestamps_and_score():
    lp = peaky([0, 1, 1, 0, 2, 0, 0, 2], V=4)
    (hyp,) = ctc_greedy_hypotheses(lp[None], torch.tensor([8]))
    assert hyp.tokens == (1, 2, 2)
    assert hyp.timestamps == (1, 4, 7)
    assert hyp.score == pytest.approx(lp.max(dim=-1).values.sum().item(), abs=1e-5)


def test_greedy_rejects_bad_shapes():
    with pytest.raises(ValueError, match="B, T, V"):
        ctc_greedy(torch.zeros(4, 5), torch.tensor([4]))
    with pytest.raises(ValueError, match="lengths"):
        ctc_greedy(torch.zeros(2, 4, 5), torch.tensor([4]))


# ------------------------------------------------------------------------ prefix beam search


def test_beam_one_equals_greedy_on_peaky_distribution():
    g = torch.Generator().manual_seed(1)
    for seed in range(5):
        ids = torch.randint(0, 6, (30,), generator=g).tolist()
        lp = peaky(ids, V=6, peak=5.0, noise=0.5, seed=seed)
        (best,) = ctc_prefix_beam_search(lp, beam_size=1)
        assert list(best.tokens) == ctc_greedy(lp[None], torch.tensor([30]))[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unpruned_search_equals_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(6, 4, generator=g).mul(1.5).log_softmax(dim=-1)  # T=6, V=4: 4096 alignments
    exact = brute_force(lp)
    hyps = ctc_prefix_beam_search(lp, beam_size=10_000, top_k=4)
    assert len(hyps) == len(exact)  # every label sequence reachable, each exactly once (merged)
    for h in hyps:
        assert h.score == pytest.approx(exact[h.tokens], abs=1e-5)
    best = max(exact, key=exact.get)
    assert hyps[0].tokens == best
    assert math.isclose(math.fsum(math.exp(h.score) for h in hyps), 1.0, abs_tol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pruned_search_finds_brute_force_best(seed):
    g = torch.Generator().manual_seed(10 + seed)
    lp = torch.randn(6, 4, generator=g).mul(2.0).log_softmax(dim=-1)
    exact = brute_force(lp)
    best = max(exact, key=exact.get)
    (top,) = ctc_prefix_beam_search(lp, beam_size=8)[:1]
    assert top.tokens == best
    # The kept prefixes may have lost some alignments to pruning, never gained probability.
    assert top.score <= exact[best] + 1e-6


def test_repeated_token_needs_blank():
    # "a a" over 2 frames collapses to (a,); (a, a) needs a blank between: impossible in 2 frames.
    lp = torch.log(torch.tensor([[0.1, 0.9], [0.1, 0.9]]))
    hyps = {h.tokens: h.score for h in ctc_prefix_beam_search(lp, beam_size=10)}
    assert (1, 1) not in hyps
    assert hyps[(1,)] == pytest.approx(math.log(0.9 * 0.9 + 0.1 * 0.9 + 0.9 * 0.1), abs=1e-6)
    assert hyps[()] == pytest.approx(math.log(0.01), abs=1e-6)


def test_prefix_beam_timestamps_on_peaky_distribution():
    lp = peaky([0, 1, 1, 0, 2, 0, 0, 2, 3], V=5, noise=0.3)
    best = ctc_prefix_beam_search(lp, beam_size=4)[0]
    assert best.tokens == (1, 2, 2, 3)
    assert best.timestamps == (1, 4, 7, 8)


def test_streaming_advance_equals_one_shot():
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(23, 7, generator=g).mul(2.0).log_softmax(dim=-1)
    one_shot = ctc_prefix_beam_search(lp, beam_size=5, top_k=4)
    state = PrefixBeamState(beam_size=5, top_k=4)
    start = 0
    for size in (3, 0, 8, 1, 11):
        state.advance(lp[start : start + size])
        start += size
        partial = state.nbest(1)
        assert len(partial) == 1 and partial[0].timestamps == tuple(t for t in partial[0].timestamps if t < start)
    assert start == 23 and state.frames == 23
    streamed = state.nbest()
    assert [h.tokens for h in streamed] == [h.tokens for h in one_shot]
    assert [h.score for h in streamed] == [h.score for h in one_shot]
    assert [h.timestamps for h in streamed] == [h.timestamps for h in one_shot]


def test_prune_threshold_keeps_search_alive():
    lp = torch.full((4, 5), math.log(0.2))  # flat: every token below the threshold
    hyps = ctc_prefix_beam_search(lp, beam_size=3, prune_threshold=math.log(0.5))
    assert len(hyps) >= 1


def test_batch_wrapper_respects_lengths():
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(2, 9, 5, generator=g).log_softmax(dim=-1)
    lengths = torch.tensor([9, 4])
    batched = ctc_prefix_beam_search_batch(lp, lengths, beam_size=3)
    for b, n in enumerate(lengths.tolist()):
        single = ctc_prefix_beam_search(lp[b, :n], beam_size=3)
        assert [(h.tokens, h.score) for h in batched[b]] == [(h.tokens, h.score) for h in single]


def test_prefix_beam_rejects_bad_arguments():
    with pytest.raises(ValueError, match="beam_size"):
        PrefixBeamState(beam_size=0)
    with pytest.raises(ValueError, match="one utterance"):
        PrefixBeamState().advance(torch.zeros(1, 4, 5))
    with pytest.raises(ValueError, match="blank"):
        PrefixBeamState(blank=9).advance(torch.zeros(4, 5))
