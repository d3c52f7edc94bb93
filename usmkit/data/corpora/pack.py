"""A transcoded copy of a corpus folder, same layout, for moving corpora under a size budget.

Every audio file under ``src`` (``.sph``, ``.wav``, ``.flac``, ``.opus``, ``.ogg``) is decoded and
written under ``out`` at the same relative path with the new codec's suffix; every other file
(transcripts, file lists, licenses) is copied as it is. The AN4 and Kathleen recipes read the copy
like the original (``corpus_dir=OUT``)::

    python -m usmkit.cli.prepare pack src=$USMKIT_CORPORA/an4 out=an4_flac codec=flac
    python -m usmkit.cli.prepare pack src=$USMKIT_CORPORA/kathleen out=kathleen_opus codec=opus bitrate_kbps=24

Codecs (libsndfile, through ``soundfile``; the sample rate is kept):

- ``flac``: lossless, 16-bit samples decode bit-exact.
- ``opus`` (``.opus``, Ogg Opus): lossy, ``bitrate_kbps`` per channel, variable bitrate. libsndfile
  maps its compression level linearly onto 256 (level 0) .. 6 (level 1) kbit/s; we invert that map.
- ``vorbis`` (``.ogg``): lossy, ``compression_level`` in [0, 1] (1 = smallest; at 16 kHz mono
  libsndfile's Vorbis does not go below ~34 kbit/s).

``.sph`` files are read with ``read_sphere`` (checked against their header). A file that cannot be
read stops the copy naming it (``on_error=fail``) or is left out and counted (``on_error=skip``).
A ``pack.json`` in ``out`` records the source, codec, bitrate and sizes.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf

from usmkit.data.audio_files import write_audio
from usmkit.data.corpora.common import RecipeDrops, RecipeError, drops_footer
from usmkit.data.corpora.sphere import SphereError, read_sphere

Codec = Literal["flac", "opus", "vorbis"]
AUDIO_SUFFIXES = (".sph", ".wav", ".flac", ".opus", ".ogg")
SUFFIX = {"flac": ".flac", "opus": ".opus", "vorbis": ".ogg"}
OPUS_KBPS_RANGE = (6.0, 256.0)  # libsndfile's Opus bitrates at compression level 1 and 0
MANIFEST = "pack.json"


def opus_compression_level(bitrate_kbps: float) -> float:
    """libsndfile compression level that asks its Opus encoder for ``bitrate_kbps`` (per channel).

    >>> round(opus_compression_level(24.0), 3)
    0.928
    """
    low, high = OPUS_KBPS_RANGE
    if not low <= bitrate_kbps <= high:
        raise RecipeError(f"bitrate_kbps must be in [{low:g}, {high:g}] for Opus, got {bitrate_kbps:g}")
    return (high - bitrate_kbps) / (high - low)


@dataclass(frozen=True)
class PackSettings:
    codec: Codec = "opus"
    bitrate_kbps: float = 24.0  # opus only
    compression_level: float | None = None  # flac / vorbis; None: libsndfile's default

    def write_kwargs(self) -> dict:
        """``soundfile.write`` arguments (format, subtype, compression level) for this codec."""
        if self.codec == "flac":
            return {"format": "FLAC", "compression_level": self.compression_level}
        if self.codec == "opus":
            return {"format": "OGG", "subtype": "OPUS", "compression_level": opus_compression_level(self.bitrate_kbps)}
        if self.codec == "vorbis":
            return {"format": "OGG", "subtype": "VORBIS", "compression_level": self.compression_level}
        raise RecipeError(f"codec must be flac, opus or vorbis, got {self.codec!r}")


def read_audio(path: Path) -> tuple[np.ndarray, int, str]:
    """Samples, sample rate and the FLAC subtype that keeps them exact (``PCM_16`` or ``PCM_24``).

    Samples are int16 for 16-bit (and lossy) sources, int32 for 24/32-bit ones."""
    if path.suffix == ".sph":
        samples, rate = read_sphere(path)
        return samples, rate, "PCM_16"
    info = sf.info(path)
    if info.subtype in ("PCM_24", "PCM_32"):
        samples, rate = sf.read(path, dtype="int32")
        return samples, rate, "PCM_24"
    samples, rate = sf.read(path, dtype="int16")
    return samples, rate, "PCM_16"


def transcode(src: Path, dst: Path, settings: PackSettings) -> None:
    """Decode ``src`` and write it to ``dst`` with ``settings`` (raises on unreadable input)."""
    samples, rate, flac_subtype = read_audio(src)
    if samples.shape[0] == 0:
        raise ValueError("it holds no samples")
    kwargs = settings.write_kwargs()
    if settings.codec == "flac":
        kwargs["subtype"] = flac_subtype
    else:  # the lossy encoders take float samples in [-1, 1)
        scale = 2.0**31 if samples.dtype == np.int32 else 2.0**15
        samples = samples.astype(np.float32) / scale
    write_audio(dst, samples, rate, **{k: v for k, v in kwargs.items() if v is not None})


@dataclass(frozen=True)
class PackReport:
    src: str
    codec: str
    bitrate_kbps: float | None
    compression_level: float | None
    audio_files: int
    other_files: int
    seconds: float
    src_audio_bytes: int
    out_audio_bytes: int
    out_total_bytes: int

    @property
    def kbps(self) -> float:
        return self.out_audio_bytes * 8 / 1000 / max(self.seconds, 1e-9)


def pack_corpus(
    src: str | Path, out: str | Path, settings: PackSettings, workers: int = 1, drops: RecipeDrops | None = None
) -> PackReport:
    """Write the transcoded copy of ``src`` to ``out`` (see the module doc) and ``out/pack.json``."""
    src, out = Path(src).resolve(), Path(out).resolve()
    drops = drops if drops is not None else RecipeDrops("fail")
    settings.write_kwargs()  # a bad codec or bitrate fails before any file is written
    if not src.is_dir():
        raise FileNotFoundError(f"src={src} is not a folder; pass the corpus folder to copy (e.g. $USMKIT_CORPORA/an4)")
    if out == src or src in out.parents:
        raise RecipeError(f"out={out} must lie outside src={src}")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise RecipeError(f"out={out} is not empty and holds no {MANIFEST}; pass a new folder")
        shutil.rmtree(out)  # an earlier copy of ours: replaced whole, so no file of another codec stays
    files = sorted(p for p in src.rglob("*") if p.is_file())
    audio = [p for p in files if p.suffix in AUDIO_SUFFIXES]
    others = [p for p in files if p.suffix not in AUDIO_SUFFIXES]
    out.mkdir(parents=True, exist_ok=True)
    for path in others:
        dst = out / path.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst)

    def one(path: Path) -> tuple[int, int, float] | None:  # (src bytes, out bytes, seconds)
        drops.seen()
        dst = (out / path.relative_to(src)).with_suffix(SUFFIX[settings.codec])
        try:
            transcode(path, dst, settings)
        except (SphereError, sf.LibsndfileError, RuntimeError, ValueError) as e:
            dst.unlink(missing_ok=True)
            drops.drop("corrupt audio", str(path), f"cannot decode it ({e})")
            return None
        info = sf.info(dst)
        return path.stat().st_size, dst.stat().st_size, info.frames / info.samplerate

    with ThreadPoolExecutor(max(1, workers)) as pool:
        done = [r for r in pool.map(one, audio) if r is not None]
    report = PackReport(
        src=str(src),
        codec=settings.codec,
        bitrate_kbps=settings.bitrate_kbps if settings.codec == "opus" else None,
        compression_level=settings.compression_level,
        audio_files=len(done),
        other_files=len(others),
        seconds=sum(r[2] for r in done),
        src_audio_bytes=sum(r[0] for r in done),
        out_audio_bytes=sum(r[1] for r in done),
        out_total_bytes=sum(r[1] for r in done) + sum(p.stat().st_size for p in others),
    )
    (out / MANIFEST).write_text(json.dumps({**asdict(report), "kbps": round(report.kbps, 2)}, indent=2) + "\n")
    return report


@dataclass(frozen=True)
class PackArgs:
    src: str = ""
    out: str = ""
    codec: str = "opus"  # flac | opus | vorbis
    bitrate_kbps: float = 24.0
    compression_level: float | None = None
    workers: int = 1
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare pack src=DIR out=DIR [key=value ...]

  src=DIR                  corpus folder to copy (e.g. $USMKIT_CORPORA/an4)
  out=DIR                  where the copy goes (same layout, audio transcoded, other files copied)
  codec=flac|opus|vorbis   flac: lossless; opus: lossy at bitrate_kbps; vorbis: lossy at compression_level (default opus)
  bitrate_kbps=K           Opus bitrate per channel, 6-256 (default 24)
  compression_level=L      FLAC/Vorbis level in [0, 1] (default: libsndfile's)
  workers=N                encoder threads (default 1)
  on_error=fail|skip       stop at the first unreadable audio file (default) or leave it out, counted
"""


def run(args: PackArgs) -> None:
    """``python -m usmkit.cli.prepare pack key=value ...`` (``USAGE``)."""
    if not args.src or not args.out:
        raise RecipeError("pass both src=DIR (the corpus folder) and out=DIR (where the copy goes)")
    if args.codec not in SUFFIX:
        raise RecipeError(f"codec must be flac, opus or vorbis, got {args.codec!r}")
    settings = PackSettings(args.codec, args.bitrate_kbps, args.compression_level)  # type: ignore[arg-type]
    drops = RecipeDrops(args.on_error)  # type: ignore[arg-type]  (checked there)
    report = pack_corpus(args.src, args.out, settings, workers=args.workers, drops=drops)
    print(
        f"{report.audio_files} audio files ({report.seconds / 3600:.3f} h) {report.src_audio_bytes / 1e6:.1f} MB -> "
        f"{report.out_audio_bytes / 1e6:.1f} MB {args.codec} ({report.kbps:.1f} kbit/s); "
        f"{report.other_files} other files copied; {args.out} holds {report.out_total_bytes / 1e6:.1f} MB"
    )
    print(drops_footer(drops))


ARGS = PackArgs
