"""Files that are never seen half-written: write to a private temporary name, then rename into place.

A reader (another process building the same folder, a loader) sees the old file or the new one, never a
part; a write that fails or is killed leaves the old file as it was. The temporary name is the writer's
own (process id and a random part), so two processes writing one path at once each rename a whole file.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix) to write; on success it replaces ``path``.

    >>> with replaced_atomically("out/x.flac") as tmp:  # doctest: +SKIP
    ...     soundfile.write(tmp, samples, 16000)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
