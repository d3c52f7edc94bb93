"""NIST SPHERE (``.sph``) audio: read with libsndfile, checked against the file's own header.

Why not through lhotse: lhotse sends every ``.sph`` path to the ``sph2pipe`` binary (its special
case for SPHERE/shorten files), which is not installed here or on the GPU machines and which
``lhotse install-sph2pipe`` would download. libsndfile (``soundfile``) reads uncompressed NIST
SPHERE itself, so the recipes decode ``.sph`` with it and store FLAC, which every lhotse backend reads.

What libsndfile does not check, this module does: a file cut short decodes without an error (to
the samples that are there), so ``read_sphere`` compares the decoded length with the header's
``sample_count``, and the header's ``sample_checksum`` (the sum of the 16-bit samples modulo 2^16,
as NIST's tools write it) with the samples, so flipped or overwritten bytes are found too.

>>> header = parse_sphere_header(b"NIST_1A\\n   1024\\nsample_count -i 3\\nsample_rate -i 16000\\nend_head\\n")
>>> header["sample_count"], header["sample_rate"]
(3, 16000)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf

MAGIC = b"NIST_1A"


class SphereError(ValueError):
    """A ``.sph`` file that is not usable audio; the message says what is wrong with it."""


def parse_sphere_header(data: bytes) -> dict[str, int | str]:
    """The ``name -i|-r|-sN value`` fields of a NIST SPHERE header (the file's first bytes).

    Integer (``-i``) fields become ints; others stay strings. Raises ``SphereError`` when ``data``
    does not start with ``NIST_1A`` and a header size, or the header has no ``end_head``.
    """
    lines = data.split(b"\n")
    if len(lines) < 2 or lines[0].strip() != MAGIC or not lines[1].strip().isdigit():
        raise SphereError("not a NIST SPHERE file (no 'NIST_1A' header)")
    size = int(lines[1])
    fields: dict[str, int | str] = {}
    for raw in data[:size].split(b"\n")[2:]:
        line = raw.decode("ascii", errors="replace").strip()
        if line == "end_head":
            return fields
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1].startswith("-"):
            name, kind, value = parts
            fields[name] = int(value) if kind == "-i" and value.lstrip("-").isdigit() else value
    raise SphereError(f"the SPHERE header has no 'end_head' within its declared {size} bytes")


def read_sphere(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Samples ``(N,)`` int16 (mono) or ``(N, C)`` and the sample rate of an uncompressed ``.sph``.

    Raises ``SphereError`` when the file is not SPHERE, is compressed (shorten), does not decode,
    holds fewer samples than its header declares, or fails the header's checksum.
    """
    path = Path(path)
    with path.open("rb") as f:
        head = f.read(4096)
    header = parse_sphere_header(head)
    coding = str(header.get("sample_coding", "pcm"))
    if coding != "pcm":
        raise SphereError(f"sample_coding is {coding!r}; only uncompressed 'pcm' SPHERE is read here")
    try:
        samples, rate = sf.read(path, dtype="int16", always_2d=False)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise SphereError(f"libsndfile cannot decode it ({e})") from None
    frames = samples.shape[0]
    declared = header.get("sample_count")
    if isinstance(declared, int) and frames != declared:
        raise SphereError(f"the header declares {declared} samples but the file holds {frames} (truncated?)")
    checksum = header.get("sample_checksum")
    if isinstance(checksum, int) and int(header.get("sample_n_bytes", 2)) == 2:
        actual = int(samples.astype(np.int64).sum()) % 65536
        if actual != checksum:
            raise SphereError(f"sample checksum {actual} does not match the header's {checksum} (corrupt samples)")
    if frames == 0:
        raise SphereError("it holds no samples")
    return samples, int(rate)
