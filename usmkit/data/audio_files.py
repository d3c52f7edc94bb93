"""Audio files that are never seen half-written.

``write_audio`` writes to a temporary name of its own in the target's directory and renames it into
place, so a reader (another recipe run building the same folder, a training run's loader) sees the old
file or the new one, never a part, and a write that fails or is killed leaves the old file as it was.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf


def write_audio(path: str | os.PathLike[str], samples: np.ndarray, rate: int, **kwargs: Any) -> Path:
    """``soundfile.write(path, samples, rate, **kwargs)``, atomically (see the module docstring).

    The temporary name keeps ``path``'s suffix, so the format is inferred from it as usual."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        sf.write(tmp, samples, rate, **kwargs)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
