"""What batch transcription reads: a folder of audio files, a text file list, or a lhotse cuts manifest.

``find_inputs(spec)`` turns the ``inputs=`` value into ``AudioItem``s (id, path, duration), reading only
file headers (soundfile) or manifest metadata, never the audio; files that cannot be used are left out
and counted in the returned ``ValidationReport``, each with one line saying why:

- a folder: every file under it (recursively) whose suffix is an audio format (``AUDIO_SUFFIXES``); an
  item's id is its path relative to the folder (``talks/day1.flac``);
- a text file: one audio path per line (blank lines and ``#`` comments ignored), relative paths taken
  from the list's own folder; an item's id is the path as listed;
- one audio file (its id: its name);
- a lhotse cuts manifest (``*.jsonl.gz`` / ``*.jsonl``, read with ``usmkit.data.manifests.read_cuts``):
  each cut is an item (its id, its recording's file, its own offset and duration), so a manifest of
  segments of long recordings is transcribed segment by segment.

``plan_units`` orders the items for one process: sorted by duration (longest first, so a batch that
does not fit in memory fails at once, not hours in), every ``world``-th item to a rank (interleaved:
the ranks get similar totals), files above ``long_seconds`` alone (``LongUnit``: encoded in windows),
the rest in ``BatchUnit``s of similar durations whose padded length (rows x longest) stays within
``batch_seconds``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf
from lhotse.cut import Cut

from usmkit.data.audio_files import declared_frames, rate_problem
from usmkit.data.manifests import read_cuts
from usmkit.data.validate import Problem, ValidationReport
from usmkit.errors import UsageError

# File-name suffixes of the audio formats libsndfile reads that hold speech recordings (of
# soundfile.available_formats(); the rarer ones, e.g. MATLAB's .mat, would mostly catch files that are not audio).
AUDIO_SUFFIXES = frozenset(
    {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".au", ".snd", ".w64", ".rf64"}
    | {".caf", ".sph", ".nist"}
)
MANIFEST_SUFFIXES = (".jsonl.gz", ".jsonl")
MIN_SECONDS = 0.025  # one 25 ms feature window: a shorter input gives no feature frame


@dataclass(frozen=True)
class AudioItem:
    """One input to transcribe: ``id`` (unique among the inputs), the audio file, its duration in seconds,
    and for a manifest input the lhotse cut it came from (its offset into the recording)."""

    id: str
    path: str
    duration: float
    cut: Cut | None = None


@dataclass(frozen=True)
class BatchUnit:
    """Files transcribed together: padded to the longest, encoded by one forward."""

    items: tuple[AudioItem, ...]


@dataclass(frozen=True)
class LongUnit:
    """One file too long for a batch: read, featurized and encoded piece by piece in flat memory."""

    item: AudioItem


def find_inputs(spec: str) -> tuple[list[AudioItem], ValidationReport]:
    """The items of ``inputs=spec`` (a folder, a file list, a cuts manifest or one audio file) and the report of those left
    out. ``UsageError`` when ``spec`` does not exist or holds no usable input at all."""
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"inputs={spec}: no such file or folder; pass a folder of audio, a file list or a manifest")
    report = ValidationReport(unit="files")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
        if not files:
            raise UsageError(
                f"inputs={spec}: the folder holds no audio files (looked for {', '.join(sorted(AUDIO_SUFFIXES)[:8])}, "
                "... recursively); pass the folder that holds them, a file list or a manifest"
            )
        items = _probe([(p.relative_to(path).as_posix(), p) for p in files], report)
    elif path.name.endswith(MANIFEST_SUFFIXES):
        items = _manifest_items(path, report)
    elif path.suffix.lower() in AUDIO_SUFFIXES:
        items = _probe([(path.name, path)], report)
    else:
        items = _probe(_listed(path), report)
    if not items and not report.problems:
        raise UsageError(f"inputs={spec}: it names no audio to transcribe")
    return items, report


def _listed(path: Path) -> list[tuple[str, Path]]:
    """(id, file) of every line of the file list ``path``; the same file twice is refused."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UsageError(
            f"inputs={path}: not a text file list (nor a folder or a .jsonl.gz manifest); pass one audio path a line"
        ) from None
    entries, seen = [], {}
    for number, line in enumerate(lines, 1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if name in seen:
            raise UsageError(f"inputs={path}: line {number} repeats {name} (line {seen[name]}); list each file once")
        seen[name] = number
        entries.append((name, path.parent / name))
    return entries


def _probe(entries: list[tuple[str, Path]], report: ValidationReport) -> list[AudioItem]:
    """Items of (id, file) pairs, durations from the headers; unreadable files counted in ``report``."""
    items = []
    for item_id, file in entries:
        report.total += 1
        problem = _header_problem(file)
        if isinstance(problem, Problem):
            report.problems.append(problem)
            continue
        items.append(AudioItem(item_id, str(file), problem))
    return items


def _header_problem(file: Path) -> Problem | float:
    """The file's duration in seconds from its header, or the ``Problem`` that leaves it out."""
    if not file.is_file():
        return Problem("missing audio", str(file), "no such file")
    if file.stat().st_size == 0:
        return Problem("empty audio", str(file), "the file has 0 bytes")
    try:
        info = sf.info(str(file))
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        return Problem("corrupt audio", str(file), f"cannot decode it as audio ({e})")
    rate = rate_problem(info.samplerate, None)  # (FileSource checks the resampling to the model's rate)
    if rate:
        return Problem("unusable sample rate", str(file), rate)
    seconds = declared_frames(info) / info.samplerate
    if seconds < MIN_SECONDS:
        return Problem("too short", str(file), f"{seconds:.3f} s of audio, less than one 25 ms feature frame")
    return seconds


def _manifest_items(path: Path, report: ValidationReport) -> list[AudioItem]:
    """The cuts of the manifest ``path``; a cut id twice is refused (each id is one line of the output, as
    training refuses a manifest that repeats one)."""
    cuts = read_cuts(path)
    items, seen = [], {}
    for number, cut in enumerate(cuts, 1):
        report.total += 1
        if not isinstance(cut, Cut) or not cut.has_recording:
            raise UsageError(
                f"inputs={path}: {getattr(cut, 'id', cut)} is not a cut with a recording; pass a cuts manifest"
            )
        if cut.id in seen:
            raise UsageError(
                f"inputs={path}: cut {number} repeats the id {cut.id!r} (cut {seen[cut.id]}); give each cut its own "
                "id, or remove the repeated cut"
            )
        seen[cut.id] = number
        source = cut.recording.sources[0].source if cut.recording.sources else cut.recording.id
        if cut.duration < MIN_SECONDS:
            report.problems.append(Problem("too short", cut.id, f"{cut.duration:.3f} s, less than one feature frame"))
            continue
        items.append(AudioItem(cut.id, str(source), float(cut.duration), cut))
    return items


def plan_units(
    items: list[AudioItem],
    *,
    rank: int,
    world: int,
    batch_seconds: float,
    max_batch_size: int,
    long_seconds: float | None,
) -> list[BatchUnit | LongUnit]:
    """This rank's work, longest first: ``LongUnit``s for items over ``long_seconds`` (None: none are), then
    ``BatchUnit``s of items sorted by duration, each with rows x its longest <= ``batch_seconds`` (at least one row).

    >>> its = [AudioItem(str(i), "", d) for i, d in enumerate([3.0, 9.0, 4.0, 1.0, 2.0])]
    >>> [[i.id for i in u.items] for u in plan_units(its, rank=0, world=1, batch_seconds=8, max_batch_size=9, long_seconds=None)]
    [['1'], ['2', '0'], ['4', '3']]
    """
    ordered = sorted(items, key=lambda i: (-i.duration, i.id))[rank::world]
    units: list[BatchUnit | LongUnit] = []
    current: list[AudioItem] = []
    for item in ordered:
        if long_seconds is not None and item.duration > long_seconds:
            units.append(LongUnit(item))
            continue
        longest = current[0].duration if current else item.duration
        if current and ((len(current) + 1) * longest > batch_seconds or len(current) >= max_batch_size):
            units.append(BatchUnit(tuple(current)))
            current = []
        current.append(item)
    if current:
        units.append(BatchUnit(tuple(current)))
    return units


def output_name(item_id: str, suffix: str) -> str:
    """A relative file name for ``item_id``'s own output (an SRT file): its audio suffix replaced by
    ``suffix``, no absolute or ``..`` parts (an id that is an absolute path lands inside the output folder)."""
    parts = [p for p in item_id.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    name = "/".join(parts) or "_"
    stem, ext = os.path.splitext(name)
    return (stem if ext.lower() in AUDIO_SUFFIXES else name) + suffix
