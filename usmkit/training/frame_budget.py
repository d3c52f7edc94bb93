"""Whether CTC can align the training transcripts at the encoder's frame rate.

CTC needs at least one encoder frame per label plus one between each pair of repeated neighbours
(the blank that keeps them apart); an utterance with fewer frames has no alignment, and the loss
ignores it (``zero_infinity``). At 8x subsampling (12.5 frames a second) a character vocabulary on
ordinary speech stops fitting, so a run would train on a fraction of its data without a word: the
entry point counts such utterances first (``check_frame_budget``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from lhotse.cut import Cut

from usmkit.config import ConfigError
from usmkit.data.dataset import TextEncoder, cut_text
from usmkit.models.subsampling import output_lengths
from usmkit.ssl.alignment import frames_needed

log = logging.getLogger(__name__)

WARN_SHARE = 0.05  # a warning from this share of unalignable utterances on (a few fast ones are usual)
REFUSE_SHARE = 0.5  # refused from this share on: most of the data would be ignored


@dataclass(frozen=True)
class FrameBudget:
    """How many transcribed utterances CTC cannot align at ``factor``x subsampling."""

    factor: int
    frames_per_second: float  # encoder frames
    utterances: int  # with a transcript
    unalignable: int
    example: str = ""  # the id of one unalignable utterance

    @property
    def share(self) -> float:
        return self.unalignable / self.utterances if self.utterances else 0.0


def frame_budget(
    cuts: Iterable[Cut], tokenizer: TextEncoder, factor: int, frame_shift_ms: float, front_end: str = "conv2d"
) -> FrameBudget:
    """Count the transcribed cuts whose encoder frames at ``factor``x subsampling (by ``front_end``, a
    ``ConformerConfig.front_end``) of feature frames every ``frame_shift_ms`` are fewer than their labels need."""
    shift_s = frame_shift_ms / 1000
    ids, frames, needed = [], [], []
    for cut in cuts:
        text = cut_text(cut)
        if not text:
            continue
        ids.append(cut.id)
        frames.append(cut.num_frames or round(cut.duration / shift_s))
        needed.append(frames_needed(tokenizer.encode(text)))
    short = output_lengths(torch.tensor(frames, dtype=torch.int64), factor, front_end) < torch.tensor(needed)  # (N,)
    example = ids[int(short.nonzero()[0, 0])] if bool(short.any()) else ""
    return FrameBudget(factor, 1 / (shift_s * factor), len(ids), int(short.sum()), example)


def check_frame_budget(budget: FrameBudget, split: str, *, warn: bool = True) -> None:
    """Warn (where ``warn``) when CTC cannot align 5% of ``split``'s utterances or more; refuse
    (``ConfigError``) from half of them on."""
    if budget.share < WARN_SHARE:
        return
    fewer_tokens = "a tokenizer with fewer tokens per second (a larger vocab_size)"
    remedy = f"Use model.subsampling_factor=4, or {fewer_tokens}" if budget.factor > 4 else f"Use {fewer_tokens}"
    message = (
        f"model.subsampling_factor={budget.factor} gives {budget.frames_per_second:g} encoder frames a second, fewer than the CTC "
        f"labels need (a frame per token, one more between repeated tokens) in {budget.unalignable} of "
        f"{budget.utterances} {split} utterances ({100 * budget.share:.1f}%, e.g. {budget.example}); CTC ignores "
        f"them. {remedy}"
    )
    if budget.share >= REFUSE_SHARE:
        raise ConfigError(message)
    if warn:
        log.warning(message)
