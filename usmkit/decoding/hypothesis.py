"""One entry of an n-best list, shared by every decoder (CTC, LAS, rescoring)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hypothesis:
    """A decoded token sequence and its scores (natural-log probabilities).

    ``tokens`` never contains blank, ``<s>`` or ``</s>``. ``score`` is what the decoder ranked by;
    ``ctc_score`` / ``att_score`` are the parts each model gave (``None`` where a model took no part).
    ``timestamps[i]`` is the encoder frame where ``tokens[i]`` was emitted (CTC decoders only; one
    encoder frame is 40 ms with the 4x subsampling front end).
    """

    tokens: tuple[int, ...]
    score: float
    ctc_score: float | None = None
    att_score: float | None = None
    timestamps: tuple[int, ...] = ()
