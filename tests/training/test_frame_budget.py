"""CTC's frame budget: which transcripts the encoder's frame rate cannot align, and what the entry point says."""

from __future__ import annotations

import logging

import pytest
from lhotse import MonoCut, SupervisionSegment

from usmkit.config import ConfigError
from usmkit.training.frame_budget import check_frame_budget, frame_budget


class Characters:
    """A character tokenizer: one token per character."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def cut(cut_id: str, seconds: float, text: str | None) -> MonoCut:
    sups = (
        []
        if text is None
        else [SupervisionSegment(id=cut_id, recording_id=cut_id, start=0, duration=seconds, text=text)]
    )
    return MonoCut(id=cut_id, start=0, duration=seconds, channel=0, supervisions=sups)


def test_frames_against_labels_at_4x_and_8x():
    # 1 s = 100 feature frames: 24 encoder frames at 4x, 11 at 8x.
    cuts = [
        cut("fits-both", 1.0, "abcdefghij"),  # 10 labels
        cut("fits-4x", 1.0, "abcdefghijklmno"),  # 15
        cut("repeats", 1.0, "aabbccddeeffgghhiijjkkl"),  # 23 tokens + 11 blanks between repeats: 34
        cut("untranscribed", 1.0, None),  # not counted
    ]
    four, eight = frame_budget(cuts, Characters(), 4, 10.0), frame_budget(cuts, Characters(), 8, 10.0)
    assert (four.utterances, four.unalignable, four.example) == (3, 1, "repeats")
    assert (eight.utterances, eight.unalignable, eight.example) == (3, 2, "fits-4x")


def test_few_are_let_through_more_are_named_most_are_refused(caplog):
    def budget(unalignable):
        return frame_budget(
            [cut(f"c{i}", 1.0, "abcdefghijklmno" if i < unalignable else "ab") for i in range(100)],
            Characters(),
            8,
            10.0,
        )

    with caplog.at_level(logging.WARNING, logger="usmkit.training.frame_budget"):
        check_frame_budget(budget(4), "train")
        assert not caplog.records
        check_frame_budget(budget(20), "train")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "model.subsampling_factor=8 gives 12.5 encoder frames a second" in line
    assert "20 of 100 train utterances (20.0%, e.g. c0)" in line and "Use model.subsampling_factor=4" in line
    with pytest.raises(ConfigError, match="60 of 100 train utterances"):
        check_frame_budget(budget(60), "train", warn=False)
