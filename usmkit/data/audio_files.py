"""Audio files: written whole or not at all (``usmkit.checkpointing.atomic``), and the length their
header declares (to find a file cut short)."""

from __future__ import annotations

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


def write_audio(path: str | os.PathLike[str], samples: np.ndarray, rate: int, **kwargs: Any) -> Path:
    """``soundfile.write(path, samples, rate, **kwargs)``, atomically; the format is inferred from
    ``path``'s suffix as usual (the temporary name keeps it)."""
    with replaced_atomically(path) as tmp:
        sf.write(tmp, samples, rate, **kwargs)
    return Path(path)


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
