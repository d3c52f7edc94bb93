"""Audio files: written whole or not at all (``usmkit.checkpointing.atomic``), the length their header
declares (to find a file cut short), and whether their sample rate can be resampled to the model's."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from usmkit.checkpointing.atomic import replaced_atomically

# RIFF data sizes that writers put in a header before they know the length (a WAV written to a pipe):
# they declare no length, so a shorter file is not a truncated one.
UNKNOWN_LENGTH_SIZES = (0x7FFFFFFF, 0xFFFFFFFF)
_WAV_DATA_SIZE = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)

# Rates of real recordings: telephone speech (8 kHz) down to a margin, studio converters (768 kHz) at most.
MIN_SAMPLE_RATE = 4000
MAX_SAMPLE_RATE = 768_000
# torchaudio's resampling filter has (orig / g) x (new / g) taps' rows and columns (g = gcd of the rates):
# 44.1 kHz -> 16 kHz is 441 x 160; 44.101 kHz -> 16 kHz would be 44101 x 16000 (2.8 GB of filter).
MAX_FILTER_SIZE = 1 << 22


def write_audio(path: str | os.PathLike[str], samples: np.ndarray, rate: int, **kwargs: Any) -> Path:
    """``soundfile.write(path, samples, rate, **kwargs)``, atomically; the format is inferred from
    ``path``'s suffix as usual (the temporary name keeps it)."""
    with replaced_atomically(path) as tmp:
        sf.write(tmp, samples, rate, **kwargs)
    return Path(path)


def rate_problem(rate: int, target: int | None) -> str | None:
    """Why audio at ``rate`` Hz cannot be resampled to ``target`` Hz; None when it can.

    >>> rate_problem(44100, 16000) is None, rate_problem(1, 16000)[:27]
    (True, 'its sample rate, 1 Hz, is o')

    ``target=None``: only whether ``rate`` is one of recorded audio.
    """
    convert = f"convert it, e.g. ffmpeg -i IN -ar {target or 16000} -ac 1 OUT.wav"
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        return (
            f"its sample rate, {rate} Hz, is outside the {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz of recorded audio "
            f"(a damaged header?); {convert}"
        )
    if target is None:
        return None
    g = math.gcd(rate, target)
    if (rate // g) * (target // g) > MAX_FILTER_SIZE:
        return (
            f"{rate} Hz cannot be resampled to {target} Hz here (the rates share only a factor of {g}: a "
            f"{rate // g} x {target // g} filter); {convert}"
        )
    return None


def declared_frames(info) -> int:
    """The frames the header of the file ``info`` (``soundfile.info``) declares.

    ``info.frames`` is what libsndfile will decode: for FLAC that is the header's count, but for a WAV
    whose data chunk is shorter than its header says (a file cut short) libsndfile decodes what is
    there and reports that, noting the header's size in its log (``data : 160000 (should be 95982)``,
    in bytes). This reads that note back, so a truncated WAV is found like a truncated FLAC. A size
    that writers use for an unknown length counts as no declaration.
    """
    match = _WAV_DATA_SIZE.search(getattr(info, "extra_info", "") or "")
    if match is None:
        return info.frames
    declared, present = int(match[1]), int(match[2])
    if any(size - 64 <= declared <= size for size in UNKNOWN_LENGTH_SIZES) or present <= 0 or declared <= present:
        return info.frames
    return info.frames * declared // present
