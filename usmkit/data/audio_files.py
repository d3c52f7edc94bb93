"""Audio files written whole or not at all (``usmkit.checkpointing.atomic``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from usmkit.checkpointing.atomic import replaced_atomically


def write_audio(path: str | os.PathLike[str], samples: np.ndarray, rate: int, **kwargs: Any) -> Path:
    """``soundfile.write(path, samples, rate, **kwargs)``, atomically; the format is inferred from
    ``path``'s suffix as usual (the temporary name keeps it)."""
    with replaced_atomically(path) as tmp:
        sf.write(tmp, samples, rate, **kwargs)
    return Path(path)
