"""Which cuts go into which batch: subsets, language balancing, duration bucketing, rank sharding.

Everything here reads cut metadata only (no audio), so it is cheap and runs in the main process.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset import DynamicBucketingSampler
from lhotse.dataset.sampling.base import SamplingConstraint
from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets
from lhotse.utils import compute_num_frames

from usmkit.data.config import DataConfig
from usmkit.data.packing import PackedBatchSampler, RowPacker

log = logging.getLogger(__name__)

NUM_CUTS_FOR_BINS = 10_000  # cuts read to place the duration-bucket edges (lhotse's default)


def cut_language(cut: Cut) -> str:
    """ISO code of the cut's first supervision that has one, else the cut's ``custom["language"]``
    (audio-only cuts of the unlabeled pool carry it there); "" when unknown."""
    for sup in cut.supervisions:
        if sup.language:
            return sup.language
    return str((cut.custom or {}).get("language", ""))


def cut_speaker(cut: Cut) -> str | None:
    """The speaker of the cut's first supervision that names one; None when none does."""
    return next((sup.speaker for sup in cut.supervisions if sup.speaker), None)


def language_probabilities(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """USM-style temperature sampling: p_l = n_l^(1/T) / sum_k n_k^(1/T).

    >>> language_probabilities({"en": 90, "sw": 10}, temperature=1.0)
    {'en': 0.9, 'sw': 0.1}
    >>> {k: round(v, 3) for k, v in language_probabilities({"en": 90, "sw": 10}, temperature=2.0).items()}
    {'en': 0.75, 'sw': 0.25}
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not counts or any(n <= 0 for n in counts.values()):
        raise ValueError(f"language counts must be positive, got {counts}")
    weights = {lang: n ** (1.0 / temperature) for lang, n in counts.items()}
    total = sum(weights.values())
    return {lang: w / total for lang, w in weights.items()}


def language_balanced(cuts: CutSet, temperature: float, *, seed: int) -> CutSet:
    """Draw cuts so that languages follow ``language_probabilities(counts, temperature)``.

    The lhotse-native way: split by language, repeat each language forever, and multiplex the
    streams with ``CutSet.mux(weights=n_l^(1/T))``; mux picks the next stream with probability
    proportional to its weight, which is exactly the temperature formula per drawn cut. Repeating is
    what makes the proportions hold for the whole run (a finite mux drifts back to natural proportions
    once the small languages run out), so the result is infinite: train in steps, not epochs.
    Returns ``cuts`` unchanged when T=1 or there is a single language (natural proportions, finite).
    """
    counts = Counter(cut_language(c) for c in cuts)
    if temperature == 1.0 or len(counts) < 2:
        return cuts
    langs = sorted(counts)
    probs = language_probabilities(dict(counts), temperature)
    log.info("language sampling (T=%g): %s", temperature, ", ".join(f"{k}={probs[k]:.3f}" for k in langs))
    by_lang: dict[str, list[Cut]] = {lang: [] for lang in langs}
    for c in cuts:
        by_lang[cut_language(c)].append(c)
    streams = [CutSet.from_cuts(by_lang[lang]).repeat(preserve_id=True) for lang in langs]
    return CutSet.mux(*streams, weights=[counts[lang] ** (1.0 / temperature) for lang in langs], seed=seed)


def labeled_subset(cuts: CutSet, fraction: float, *, seed: int) -> CutSet:
    """The first ``round(fraction * N)`` cuts (at least 1) in a seeded hash order of their ids.

    Deterministic for a seed, independent of manifest order, and nested: the 10% subset is inside
    the 20% one, so low-label studies compare like with like. Keeps manifest order.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"labeled fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return cuts
    ids = [c.id for c in cuts]
    keep_n = max(1, round(fraction * len(ids)))
    ranked = sorted(ids, key=lambda i: hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest())
    keep = set(ranked[:keep_n])
    return CutSet.from_cuts(c for c in cuts if c.id in keep)


@dataclass
class PaddedLengthConstraint(SamplingConstraint):
    """Batches of one shape per padded length: a cut's length is its feature frames rounded up to a
    multiple of ``pad_to``, and a batch of padded length L holds exactly ``max(1, batch_frames // L)`` cuts.

    lhotse's ``FixedBucketBatchSizeConstraint`` does the same from listed bucket edges and sizes in
    seconds; this one counts feature frames, the unit the batch is padded (and compiled) in, and derives
    each length's batch size, so no list has to match the data.
    """

    batch_frames: int  # data.max_duration in feature frames
    pad_to: int
    frame_shift: float  # seconds
    length: int = 0  # the padded length of the batch being collected (0: empty)
    num_cuts: int = 0

    def measure_length(self, example: Cut) -> float:
        if example.has_features:
            frames = example.num_frames
        else:
            frames = compute_num_frames(example.duration, self.frame_shift, example.sampling_rate)
        return -(-frames // self.pad_to) * self.pad_to

    def batch_size(self, length: int) -> int:
        return max(1, self.batch_frames // length)

    def add(self, example: Cut) -> None:
        self.length = max(self.length, int(self.measure_length(example)))
        self.num_cuts += 1

    def exceeded(self) -> bool:
        return self.num_cuts > self.batch_size(self.length)

    def close_to_exceeding(self) -> bool:
        return self.num_cuts >= self.batch_size(self.length)

    def reset(self) -> None:
        self.length = 0
        self.num_cuts = 0


class FixedShapeSampler(DynamicBucketingSampler):
    """``DynamicBucketingSampler`` with a ``PaddedLengthConstraint``, one bucket per padded length,
    incomplete batches dropped (``drop_last``), so every batch has one of a few shapes.

    lhotse refuses ``state_dict()`` for custom constraints because it cannot rebuild one from the state;
    this one is rebuilt from the config when the loader is made again, so the rest of the state resumes.
    """

    def state_dict(self) -> dict[str, Any]:
        constraint, self.constraint = self.constraint, None
        try:
            return super().state_dict()
        finally:
            self.constraint = constraint


def fixed_shape_args(head: list[Cut], cfg: DataConfig, world_size: int) -> dict[str, Any]:
    """``FixedShapeSampler``'s constraint, bucket edges and ``drop_last`` for ``cfg.fixed_batch_shapes``;
    logs the shapes and how many cuts of ``head`` an epoch leaves over (each length's incomplete batch)."""
    shift = cfg.features.frame_shift_ms / 1000.0
    constraint = PaddedLengthConstraint(round(cfg.max_duration / shift), cfg.pad_to_frames, shift)
    longest = compute_num_frames(cfg.max_cut_duration, shift, cfg.features.sample_rate)
    edges = list(range(cfg.pad_to_frames, longest + cfg.pad_to_frames, cfg.pad_to_frames))  # one bucket each
    counts = Counter(int(constraint.measure_length(c)) for c in head)
    sizes = {length: constraint.batch_size(length) for length in sorted(counts)}
    left = sum(n % (sizes[length] * world_size) for length, n in counts.items())
    log.info(
        "fixed batch shapes (cuts x padded frames): %s; an epoch leaves %d of %d cuts for a later one",
        ", ".join(f"{sizes[length]}x{length}" for length in sizes),
        left,
        len(head),
    )
    return {"constraint": constraint, "duration_bins": edges, "drop_last": True}


def make_sampler(
    cuts: CutSet,
    cfg: DataConfig,
    *,
    train: bool,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    fixed_shapes: bool = False,
    packer: RowPacker | None = None,
) -> DynamicBucketingSampler | PackedBatchSampler:
    """lhotse ``DynamicBucketingSampler`` over ``cuts``: batches of at most ``cfg.max_duration`` s
    of similar-length cuts.

    Sharding: with ``world_size`` > 1 the sampler draws ``world_size`` batches per step and keeps the
    ``rank``-th, so ranks see disjoint batches (lhotse pads the very last step with duplicates, ids
    marked ``_dup``, so that no rank waits). Evaluation (``train=False``): no shuffling and, with one
    rank, every cut exactly once. ``fixed_shapes`` (training with ``cfg.fixed_batch_shapes``): batches
    of one size per padded length instead (``FixedShapeSampler``, ``fixed_shape_args``). ``packer`` (training
    with ``cfg.pack_to_frames``): batches that fill its rows (``PackedBatchSampler``), packed from this
    function's bucketed batches of one row's seconds each.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    head = list(islice(cuts, NUM_CUTS_FOR_BINS))
    if not head:
        raise ValueError("make_sampler got an empty CutSet: nothing to load")
    if (fixed_shapes or packer is not None) and not train:
        raise ValueError("fixed batch shapes and packed rows are for training: evaluation must see every cut")
    if packer is not None:
        shift = cfg.features.frame_shift_ms / 1000.0
        rows = replace(cfg, max_duration=packer.frames * shift)
        inner = make_sampler(cuts, rows, train=True, rank=rank, world_size=world_size, seed=seed)
        return PackedBatchSampler(inner, packer, shift)
    if fixed_shapes:
        sampler_cls, kwargs = FixedShapeSampler, fixed_shape_args(head, cfg, world_size)
    else:
        # lhotse's estimator needs 2 <= num_buckets <= number of cuts. With fewer cuts, one edge above the
        # longest cut gives a single working bucket (lhotse's bucketer needs at least one edge).
        num_buckets = min(cfg.num_buckets, len(head))
        if num_buckets > 1:
            bins = estimate_duration_buckets(head, num_buckets=num_buckets)
        else:
            bins = [max(c.duration for c in head) + 1.0]
        sampler_cls = DynamicBucketingSampler
        kwargs = {"max_duration": cfg.max_duration, "duration_bins": bins, "drop_last": False}
    with warnings.catch_warnings():
        # Eager CutSets only lose lhotse's memory savings; ours are metadata-small. Keep logs clean.
        warnings.filterwarnings("ignore", message="You are using DynamicBucketingSampler with an eagerly read CutSet")
        return sampler_cls(cuts, **kwargs, shuffle=train and cfg.shuffle, world_size=world_size, rank=rank, seed=seed)
