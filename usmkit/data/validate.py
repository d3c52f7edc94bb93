"""Bad input, caught once before training or evaluation (never in the hot loop).

``validate_cuts`` checks every cut's audio and transcript. With ``on_bad="error"`` the first problem
raises ``BadInputError`` naming the file (or cut) and what to do; with ``"skip"`` bad cuts are dropped
and one summary line is logged, e.g.
``skipped 3 of 120 cuts: 1 missing file (a.wav), 1 empty transcript (cut-7), 1 corrupt audio (b.wav)``.
Nothing is dropped silently.

Transcript sources outside lhotse manifests (a Kaldi ``text`` file, a ``.txt`` per utterance) are read
with ``read_kaldi_text`` / ``read_transcript``, which reject bytes that are not UTF-8 by file and line.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lhotse import CutSet, Recording
from lhotse.audio.backend import info as audio_info
from lhotse.augmentation import Resample
from lhotse.cut import Cut

from usmkit.errors import UsageError

log = logging.getLogger(__name__)

OnBad = Literal["error", "skip"]
DURATION_TOLERANCE_S = 0.025  # lhotse's own default tolerance between declared and decoded durations
PROBE_S = 0.1  # seconds decoded from the start of each recording to prove it decodes
# lhotse feature/array storages that only read numbers from files: "memory_raw" unpickles bytes from
# the manifest, "kaldiio" runs ``cmd |`` paths in a shell, "*_url" downloads.
SAFE_STORAGE_TYPES = (
    "numpy_files",
    "lilcom_files",
    "lilcom_chunky",
    "numpy_hdf5",
    "lilcom_hdf5",
    "chunked_lilcom_hdf5",
)
FIX_HINT = "fix or remove it from the manifest, or set data.on_bad_input=skip to drop such cuts (with a summary)"


class BadInputError(UsageError, ValueError):
    """A data file or manifest entry that cannot be used; the message names it and what to do."""

    def __init__(self, kind: str, where: str, detail: str, hint: str = FIX_HINT) -> None:
        self.kind, self.where, self.detail = kind, where, detail
        super().__init__(f"{kind}: {where}: {detail}; {hint}")


@dataclass(frozen=True)
class Problem:
    kind: str  # e.g. "missing file", "empty transcript"
    name: str  # the file (audio or transcript) or cut id it concerns
    detail: str

    @property
    def short_name(self) -> str:
        """File names without their directory, for the one-line summary."""
        return Path(self.name).name if "/" in self.name else self.name


@dataclass
class ValidationReport:
    total: int = 0
    problems: list[Problem] = field(default_factory=list)
    unit: str = "cuts"  # what ``total`` counts

    @property
    def num_skipped(self) -> int:
        return len(self.problems)

    def summary(self, max_names: int = 3) -> str:
        """One line: how many were skipped, by kind, with the first few names of each kind."""
        if not self.problems:
            return f"skipped 0 of {self.total} {self.unit}"
        counts = Counter(p.kind for p in self.problems)
        parts = []
        for kind, n in counts.items():
            names = [p.short_name for p in self.problems if p.kind == kind]
            shown = ", ".join(names[:max_names]) + (", ..." if len(names) > max_names else "")
            parts.append(f"{n} {kind} ({shown})")
        return f"skipped {self.num_skipped} of {self.total} {self.unit}: " + ", ".join(parts)

    def __str__(self) -> str:
        return self.summary()


def validate_cuts(
    cuts: CutSet,
    *,
    require_text: bool,
    on_bad: OnBad = "error",
    expected_sample_rate: int = 16000,
    allow_urls: bool = False,
) -> tuple[CutSet, ValidationReport]:
    """Check each cut's audio and transcript; return the usable cuts (eager), resampled to
    ``expected_sample_rate`` where their audio is at another (correctly declared) rate.

    Audio: the file exists, is not empty, decodes, is as long as the manifest says (truncation), and
    is at the sample rate the manifest declares. A recording source that is not a file (a lhotse
    ``command`` would run a shell command) raises ``BadInputError`` naming the cut, whatever
    ``on_bad`` says, before any audio is read. Text: with ``require_text`` every cut has a non-empty
    transcript; any transcript present must be valid UTF-8.
    """
    if on_bad not in ("error", "skip"):
        raise ValueError(f"on_bad must be 'error' or 'skip', got {on_bad!r}")
    report = ValidationReport()
    audio_checked: dict[str, Problem | None] = {}  # recording id -> its problem; cuts share recordings
    kept = []
    for cut in cuts:
        report.total += 1
        check_sources(cut.to_dict(), cut.id, allow_urls=allow_urls)
        problem = _text_problem(cut, require_text)
        if problem is None:
            if not cut.has_recording:
                problem = Problem("missing recording", cut.id, "the cut has no recording in the manifest")
            else:
                rid = cut.recording.id
                if rid not in audio_checked:
                    audio_checked[rid] = _audio_problem(cut.recording)
                problem = audio_checked[rid]
        if problem is not None:
            if on_bad == "error":
                raise BadInputError(problem.kind, f"{problem.name} (cut {cut.id})", problem.detail)
            report.problems.append(problem)
            continue
        kept.append(cut if cut.sampling_rate == expected_sample_rate else cut.resample(expected_sample_rate))
    if report.problems:
        log.warning("%s", report.summary())
    rates = (_source_sample_rate(c.recording) for c in kept if c.has_recording)
    low = Counter(rate for rate in rates if rate < expected_sample_rate)
    for rate, n in sorted(low.items()):
        log.warning(
            "note: %d cuts hold %d Hz audio; the model expects %d Hz speech: they are upsampled, "
            "so their band above %d Hz is empty",
            n,
            rate,
            expected_sample_rate,
            rate // 2,
        )
    return CutSet.from_cuts(kept), report


def check_sources(data: dict, cut_id: str, *, allow_urls: bool = False, where: str = "manifest") -> None:
    """Raise ``BadInputError`` naming ``cut_id`` if any recording inside the (cut, recording) dict ``data``
    has a source that is not a file (or a URL when ``allow_urls``), or any stored features/arrays a
    storage type outside ``SAFE_STORAGE_TYPES``."""
    allowed = ("file", "url") if allow_urls else ("file",)
    for source in _sources(data):
        kind = source.get("type")
        if kind not in allowed:
            hint = "rebuild the manifest from audio files; a manifest from elsewhere may try to run commands"
            if kind == "url":
                hint = "download the audio and point the manifest at files, or allow URLs explicitly (data.allow_urls=true)"
            raise BadInputError(
                "refused recording source",
                f"cut {cut_id} in {where}",
                f"its recording source is of type {kind!r} ({str(source.get('source'))[:80]!r}); "
                f"usmkit reads audio only from {' and '.join(allowed)} sources",
                hint=hint,
            )
    for stored in _dicts_with(data, "storage_type"):
        kind = stored.get("storage_type")
        if kind not in SAFE_STORAGE_TYPES:
            raise BadInputError(
                "refused feature storage",
                f"cut {cut_id} in {where}",
                f"its stored features/arrays are of type {kind!r} ({str(stored.get('storage_path'))[:80]!r}); "
                f"usmkit reads them only from {', '.join(SAFE_STORAGE_TYPES)} (others can unpickle data or run "
                "commands)",
                hint="drop the features from the manifest (data.features.precomputed computes them again)",
            )


def _sources(data: Any) -> Iterator[dict]:
    for recording in _dicts_with(data, "sources"):
        if isinstance(recording["sources"], list):
            yield from (s for s in recording["sources"] if isinstance(s, dict))


def _dicts_with(data: Any, key: str) -> Iterator[dict]:
    """Every dict nested in ``data`` (itself included) that has ``key``."""
    if isinstance(data, dict):
        if key in data:
            yield data
        for v in data.values():
            yield from _dicts_with(v, key)
    elif isinstance(data, list):
        for v in data:
            yield from _dicts_with(v, key)


def _audio_problem(rec: Recording) -> Problem | None:
    declared_sr = _source_sample_rate(rec)
    for src in rec.sources:
        if src.type != "file":  # a URL (check_sources let it through: allowed explicitly)
            continue
        path = Path(src.source)
        if not path.is_file():
            return Problem("missing file", str(path), "the manifest points at a file that does not exist")
        if path.stat().st_size == 0:
            return Problem("empty file", str(path), "the audio file has 0 bytes")
        try:
            meta = audio_info(path)
        except Exception as e:  # lhotse tries every backend and raises AudioLoadingError; keep the gist
            return Problem("corrupt audio", str(path), f"cannot read it as audio ({_first_line(e)})")
        if meta.samplerate != declared_sr:
            return Problem(
                "sample-rate mismatch",
                str(path),
                f"the file is at {meta.samplerate} Hz but the manifest declares {declared_sr} Hz; "
                "re-create the manifest entry from the file",
            )
        if meta.duration < rec.duration - DURATION_TOLERANCE_S:
            return Problem(
                "truncated audio",
                str(path),
                f"the file holds {meta.duration:.3f} s but the manifest declares {rec.duration:.3f} s",
            )
    try:
        rec.load_audio(offset=0.0, duration=min(PROBE_S, rec.duration))
    except Exception as e:
        return Problem("corrupt audio", _rec_name(rec), f"cannot decode it ({_first_line(e)})")
    return None


def _text_problem(cut: Cut, require_text: bool) -> Problem | None:
    for sup in cut.supervisions:
        if sup.text and not _is_clean_utf8(sup.text):
            return Problem(
                "non-UTF-8 transcript",
                cut.id,
                f"supervision {sup.id!r} text {sup.text!r} holds bytes that were not valid UTF-8; "
                "re-encode the transcript source as UTF-8 and rebuild the manifest",
            )
    if not require_text:
        return None
    texts = [s.text for s in cut.supervisions if s.text is not None]
    if not texts:
        return Problem("missing transcript", cut.id, "the cut has no supervision with text")
    if not any(t.strip() for t in texts):
        return Problem("empty transcript", cut.id, "the transcript is empty")
    return None


def _is_clean_utf8(text: str) -> bool:
    """False for lone surrogates (bytes smuggled through ``errors="surrogateescape"``) and for U+FFFD
    (what a lossy ``errors="replace"`` decode leaves behind)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\ufffd" not in text


def _source_sample_rate(rec: Recording) -> int:
    """The rate the manifest declares for the file itself (before any lazy resampling)."""
    for t in rec.transforms or []:
        if isinstance(t, Resample):
            return t.source_sampling_rate
        if isinstance(t, dict) and t.get("name") == "Resample":
            return int(t["kwargs"]["source_sampling_rate"])
    return rec.sampling_rate


def _rec_name(rec: Recording) -> str:
    files = [s.source for s in rec.sources if s.type == "file"]
    return files[0] if files else f"recording {rec.id}"


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


# ---- transcript files outside lhotse manifests -------------------------------------------------


def read_transcript(path: str | Path) -> str:
    """A ``.txt`` transcript, stripped; raises ``BadInputError`` naming file and line on non-UTF-8 bytes."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise _decode_error(path, data, e) from None


def read_kaldi_text(path: str | Path, *, on_bad: OnBad = "error") -> tuple[dict[str, str], ValidationReport]:
    """A Kaldi ``text`` file (``<utt-id> <transcript>`` per line) as ``{utt_id: text}``.

    Lines with non-UTF-8 bytes or no transcript raise ``BadInputError`` naming file and line, or with
    ``on_bad="skip"`` are left out and counted in the report (and logged).
    """
    path = Path(path)
    report = ValidationReport(unit="lines")
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        report.total += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            err = BadInputError(
                "non-UTF-8 transcript",
                f"{path}:{lineno}",
                f"byte 0x{raw[e.start]:02x} (byte {e.start + 1} of the line) is not valid UTF-8",
                hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
            )
            if on_bad == "error":
                raise err from None
            report.problems.append(Problem(err.kind, f"{path}:{lineno}", err.detail))
            continue
        utt_id, _, text = line.strip().partition(" ")
        if not text.strip():
            if on_bad == "error":
                raise BadInputError(
                    "empty transcript",
                    f"{path}:{lineno}",
                    f"utterance {utt_id!r} has no text",
                    hint="add the transcript or remove the line",
                )
            report.problems.append(Problem("empty transcript", f"{path}:{lineno}", utt_id))
            continue
        out[utt_id] = text.strip()
    if report.problems:
        log.warning("%s: %s", path, report.summary())
    return out, report


def _decode_error(path: Path, data: bytes, e: UnicodeDecodeError) -> BadInputError:
    line = data.count(b"\n", 0, e.start) + 1
    col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    return BadInputError(
        "non-UTF-8 transcript",
        f"{path}:{line}",
        f"byte 0x{data[e.start]:02x} (byte {col} of the line) is not valid UTF-8",
        hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
    )
