"""MOST's three data streams, built from the run's config: unlabeled audio, paired speech, text-only.

Every step holds one batch of each active stream (``usmkit.data.mixer.StreamMixer``); a stream's
batch holds at most ``task.most.<stream>_ratio * data.max_duration`` seconds: audio seconds for the
two audio streams, estimated speech seconds for text (``tokens * text_seconds_per_token``). Unlabeled
audio is loaded without SpecAugment (BEST-RQ masks it itself, as in stage 1); paired speech with the
data config's augmentation, as in stage 3.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from itertools import islice

from lhotse import CutSet

from usmkit.data.config import DataConfig
from usmkit.data.dataset import TextEncoder, cut_text
from usmkit.data.loader import make_loader
from usmkit.data.manifests import text_only_path
from usmkit.data.mixer import StreamMixer
from usmkit.data.normalize import FeatureStats
from usmkit.data.text_only import TextOnlyLoader, read_text_only, text_items
from usmkit.ssl.most_config import MostConfig

log = logging.getLogger(__name__)

CUTS_FOR_RATE = 2000  # paired cuts read to measure the seconds of speech per token


def seconds_per_token(cuts: CutSet, tokenizer: TextEncoder) -> float:
    """Seconds of paired speech per token of its transcript (over the first ``CUTS_FOR_RATE`` cuts)."""
    seconds, tokens = 0.0, 0
    for cut in islice(cuts, CUTS_FOR_RATE):
        seconds += cut.duration
        tokens += len(tokenizer.encode(cut_text(cut)))
    if tokens == 0:
        raise ValueError(
            "the paired training cuts have no transcript tokens to measure task.most.text_seconds_per_token"
        )
    return seconds / tokens


def build_most_loader(
    most: MostConfig,
    data: DataConfig,
    paired_cuts: CutSet,
    prepare_audio_only: Callable[[str], CutSet],
    tokenizer: TextEncoder,
    stats: FeatureStats,
    *,
    seed: int,
    batches_per_step: int = 1,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> StreamMixer:
    """The mixer over the streams ``most`` needs, each a share of ``data.max_duration`` per batch.

    ``paired_cuts``: the training split, prepared with transcripts; ``prepare_audio_only(split)``
    prepares the unlabeled split's cuts (validated without transcripts). ``pin_memory``: the audio
    streams' batches arrive in page-locked memory (``make_loader``).
    """
    active = most.active_streams()
    streams = {}
    if "unlabeled" in active:
        unlabeled = replace(
            data,
            max_duration=most.unlabeled_ratio * data.max_duration,
            spec_augment=replace(data.spec_augment, enabled=False),
        )
        streams["unlabeled"] = make_loader(
            prepare_audio_only(most.unlabeled_split),
            unlabeled,
            stats=stats,
            train=True,
            rank=rank,
            world_size=world_size,
            seed=seed,
            pin_memory=pin_memory,
            endless=True,
        )
    if "paired" in active:
        streams["paired"] = make_loader(
            paired_cuts,
            replace(data, max_duration=most.paired_ratio * data.max_duration),
            tokenizer=tokenizer,
            stats=stats,
            train=True,
            rank=rank,
            world_size=world_size,
            seed=seed + 1,
            pin_memory=pin_memory,
            endless=True,
        )
    if "text" in active:
        path = most.text_only or text_only_path(data.manifest_dir, data.corpus)
        rate = most.text_seconds_per_token or seconds_per_token(paired_cuts, tokenizer)
        items = text_items(read_text_only(path), tokenizer, rate, max_tokens=data.max_text_tokens)
        if rank == 0:
            log.info("text-only stream: %d sentences from %s, %.3f s of speech per token", len(items), path, rate)
        streams["text"] = TextOnlyLoader(
            items,
            replace(data, max_duration=most.text_ratio * data.max_duration),
            rank=rank,
            world_size=world_size,
            seed=seed + 2,
        )
    return StreamMixer(streams, batches_per_step=batches_per_step)
