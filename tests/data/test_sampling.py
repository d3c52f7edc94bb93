"""Sampling: language temperature, labeled subsets, bucketing by duration, rank sharding (metadata only)."""

from __future__ import annotations

import math
from collections import Counter
from itertools import islice

import pytest
from lhotse import CutSet

from usmkit.data.sampling import (
    cut_language,
    labeled_subset,
    language_balanced,
    language_probabilities,
    make_sampler,
)


def test_language_probabilities_follow_the_temperature_formula():
    counts = {"en": 800, "de": 150, "sw": 50}
    assert language_probabilities(counts, 1.0) == pytest.approx({"en": 0.8, "de": 0.15, "sw": 0.05})
    for T in (2.0, 5.0):
        w = {k: n ** (1 / T) for k, n in counts.items()}
        assert language_probabilities(counts, T) == pytest.approx({k: v / sum(w.values()) for k, v in w.items()})
    flat = language_probabilities(counts, 1e6)
    assert max(flat.values()) - min(flat.values()) < 1e-3, "T -> inf is uniform"
    with pytest.raises(ValueError, match="temperature"):
        language_probabilities(counts, 0.0)


@pytest.mark.parametrize("temperature", [2.0, 5.0])
def test_sampled_language_proportions_follow_temperature(build_metadata_cuts, build_config, temperature):
    counts = {"en": 400, "de": 80, "sw": 20}
    cuts = build_metadata_cuts(counts)
    stream = language_balanced(cuts, temperature, seed=1)
    sampler = make_sampler(stream, build_config(max_duration=200.0), train=True, seed=1)
    drawn = [cut_language(c) for batch in islice(sampler, 70) for c in batch]
    n = len(drawn)
    assert n > 4000, "the balanced stream is infinite: it must outlast the 500-cut corpus"
    seen = Counter(drawn)
    for lang, p in language_probabilities(counts, temperature).items():
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(seen[lang] / n - p) < 5 * sigma + 0.01, (lang, seen[lang] / n, p)
    natural = counts["sw"] / sum(counts.values())
    assert seen["sw"] / n > 2 * natural, "T > 1 must up-sample the rare language"


def test_temperature_one_keeps_the_finite_corpus(build_metadata_cuts):
    cuts = build_metadata_cuts({"en": 30, "de": 10})
    assert language_balanced(cuts, 1.0, seed=0) is cuts
    single = build_metadata_cuts({"en": 30})
    assert language_balanced(single, 3.0, seed=0) is single


def test_labeled_subset_is_deterministic_nested_and_exact(build_metadata_cuts):
    cuts = build_metadata_cuts({"en": 150, "de": 50})
    ten = labeled_subset(cuts, 0.1, seed=0)
    twenty = labeled_subset(cuts, 0.2, seed=0)
    assert len(ten) == 20 and len(twenty) == 40
    assert set(ten.ids) <= set(twenty.ids)
    assert list(labeled_subset(cuts, 0.1, seed=0).ids) == list(ten.ids)
    assert set(labeled_subset(cuts, 0.1, seed=1).ids) != set(ten.ids)
    assert labeled_subset(cuts, 1.0, seed=0) is cuts


def test_batches_respect_max_duration_and_eval_sees_every_cut_once(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 60, "de": 20})
    cfg = build_config(max_duration=10.0, num_buckets=4)
    sampler = make_sampler(cuts, cfg, train=False)
    batches = list(sampler)
    assert all(sum(c.duration for c in b) <= 10.0 for b in batches)
    ids = [c.id for b in batches for c in b]
    assert sorted(ids) == sorted(cuts.ids)
    assert ids == [c.id for b in make_sampler(cuts, cfg, train=False) for c in b], "eval order is fixed"


def test_training_shuffles_per_epoch(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 60})
    sampler = make_sampler(cuts, build_config(max_duration=10.0), train=True, seed=0)
    epoch0 = [c.id for b in sampler for c in b]
    sampler.set_epoch(1)
    epoch1 = [c.id for b in sampler for c in b]
    assert sorted(epoch0) == sorted(epoch1) == sorted(cuts.ids)
    assert epoch0 != epoch1


def test_ranks_see_disjoint_batches(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 70, "de": 30})
    cfg = build_config(max_duration=10.0)
    per_rank = []
    for rank in (0, 1):
        sampler = make_sampler(cuts, cfg, train=True, rank=rank, world_size=2, seed=3)
        per_rank.append([[c.id for c in b] for b in sampler])
    assert len(per_rank[0]) == len(per_rank[1]), "equal step counts keep DDP ranks in lockstep"
    ids0 = {i for b in per_rank[0] for i in b}
    ids1 = {i for b in per_rank[1] for i in b}
    real0 = {i for i in ids0 if "_dup" not in i}
    real1 = {i for i in ids1 if "_dup" not in i}
    assert not real0 & real1
    assert real0 | real1 == set(cuts.ids)
    with pytest.raises(ValueError, match="rank"):
        make_sampler(cuts, cfg, train=True, rank=2, world_size=2)


def test_tiny_and_empty_cut_sets(build_metadata_cuts, build_config):
    one = build_metadata_cuts({"en": 1})
    assert [c.id for b in make_sampler(one, build_config(max_duration=10.0), train=True) for c in b] == list(one.ids)
    with pytest.raises(ValueError, match="empty"):
        make_sampler(CutSet.from_cuts([]), build_config(), train=False)


def test_fixed_batch_shapes_give_one_size_per_padded_length(build_metadata_cuts, build_config):
    """Every training batch holds cuts of one padded length L, exactly max_duration / (L x 10 ms) of them;
    an epoch leaves each length's last incomplete batch (fewer cuts than its size) for a later one."""
    cuts = build_metadata_cuts({"en": 120})  # 0.5-4.0 s: 50-400 frames, padded to 128/256/384/512
    cfg = build_config(max_duration=10.24, pad_to_frames=128, fixed_batch_shapes=True)
    padded = {c.id: math.ceil(round(c.duration * 100) / 128) * 128 for c in cuts}
    per_length = Counter(padded.values())
    epochs = []
    for epoch in (0, 1):
        sampler = make_sampler(cuts, cfg, train=True, seed=1, fixed_shapes=True)
        sampler.set_epoch(epoch)
        batches = [list(b) for b in sampler]
        for batch in batches:
            lengths = {padded[c.id] for c in batch}
            assert len(lengths) == 1, f"one padded length per batch, got {lengths}"
            assert len(batch) == 1024 // lengths.pop()
        seen = Counter(padded[c.id] for b in batches for c in b)
        for length, n in per_length.items():
            size = 1024 // length
            assert seen[length] == n - n % size, f"length {length}: only the last incomplete batch waits"
        epochs.append([c.id for b in batches for c in b])
    assert epochs[0] != epochs[1], "reshuffled per epoch"
    with pytest.raises(ValueError, match="every cut"):
        make_sampler(cuts, cfg, train=False, fixed_shapes=True)


def test_fixed_batch_shapes_resume_exactly(build_metadata_cuts, build_config):
    cuts = build_metadata_cuts({"en": 80})
    cfg = build_config(max_duration=10.24, pad_to_frames=128, fixed_batch_shapes=True)
    reference = [[c.id for c in b] for b in make_sampler(cuts, cfg, train=True, seed=3, fixed_shapes=True)]
    first = make_sampler(cuts, cfg, train=True, seed=3, fixed_shapes=True)
    head = [[c.id for c in b] for b in islice(first, 3)]
    resumed = make_sampler(cuts, cfg, train=True, seed=3, fixed_shapes=True)
    resumed.load_state_dict(first.state_dict())
    assert head + [[c.id for c in b] for b in resumed] == reference


def test_fixed_batch_shapes_need_padding_and_no_speed_perturbation(build_config):
    with pytest.raises(ValueError, match="pad_to_frames"):
        build_config(fixed_batch_shapes=True)
    with pytest.raises(ValueError, match="speed_perturb"):
        build_config(fixed_batch_shapes=True, pad_to_frames=256, speed_perturb=(0.9, 1.1))


def test_fixed_batch_shapes_with_ranks(build_metadata_cuts, build_config):
    """Two DDP ranks: disjoint cuts, the same number of steps, and every batch of each rank one of the
    fixed shapes (the ranks may draw different lengths in one step, as bucketed batches do)."""
    cuts = build_metadata_cuts({"en": 150})
    cfg = build_config(max_duration=10.24, pad_to_frames=128, fixed_batch_shapes=True)
    padded = {c.id: math.ceil(round(c.duration * 100) / 128) * 128 for c in cuts}
    per_rank = [
        [list(b) for b in make_sampler(cuts, cfg, train=True, rank=rank, world_size=2, seed=5, fixed_shapes=True)]
        for rank in (0, 1)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) > 0, "equal step counts keep DDP ranks in lockstep"
    for batch in per_rank[0] + per_rank[1]:
        lengths = {padded[c.id.removesuffix("_dup")] for c in batch}
        assert len(lengths) == 1 and len(batch) == 1024 // lengths.pop()
    ids = [{c.id for b in batches for c in b} for batches in per_rank]
    assert not ids[0] & ids[1]
