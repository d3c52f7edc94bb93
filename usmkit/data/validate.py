"""Bad input, caught once before training or evaluation (never in the hot loop).

``validate_cuts`` checks every cut's id, audio and transcript. With ``on_bad="error"`` the first problem
raises ``BadInputError`` naming the file (or cut) and what to do; with ``"skip"`` bad cuts are dropped
and one summary line is logged, e.g.
``skipped 3 of 120 cuts: 1 missing file (a.wav), 1 empty transcript (cut-7), 1 corrupt audio (b.wav)``.
Nothing is dropped silently. NaN/Inf samples are not a reason to drop a cut: they are counted and
reported (one line), and repaired downstream (``usmkit.data.dataset``, ``usmkit.data.normalize``).

Transcript sources outside lhotse manifests (a Kaldi ``text`` file, a ``.txt`` per utterance) are read
with ``read_kaldi_text`` / ``read_transcript``, which reject bytes that are not UTF-8 by file and line.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile as sf
from lhotse import CutSet, Recording
from lhotse.audio.backend import info as audio_info
from lhotse.augmentation import Resample
from lhotse.cut import Cut

from usmkit.data.audio_files import declared_frames, rate_problem
from usmkit.errors import UsageError

log = logging.getLogger(__name__)

OnBad = Literal["error", "skip"]
DURATION_TOLERANCE_S = 0.025  # lhotse's own default tolerance between declared and decoded durations
PROBE_S = 0.1  # seconds decoded from the start and from the end of each recording to prove it decodes
FLOAT_SUBTYPES = ("FLOAT", "DOUBLE")  # libsndfile sample encodings that can hold NaN/Inf
SCAN_BLOCK = 1 << 16  # samples per block when scanning a float file for NaN/Inf
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
MIN_DURATION_S = 0.025  # the default feature frame (FeatureConfig.frame_length_ms): shorter cuts give no feature
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
    non_finite: dict[str, int] = field(default_factory=dict)  # audio file -> its NaN/Inf samples (kept, repaired)

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
    split: str | None = None,
    min_duration: float = MIN_DURATION_S,
) -> tuple[CutSet, ValidationReport]:
    """Check each cut's id, audio and transcript; return the usable cuts (eager), resampled to
    ``expected_sample_rate`` where their audio is at another (correctly declared) rate.

    Ids: every cut has its own. Two cuts with one id are refused (``on_bad="error"``, before any audio
    is read) or the later ones dropped and counted (``"skip"``), never renamed: the id is what keys a
    cut's stored features, its batches and its results, so two cuts under one id silently become one
    (one utterance's features trained with both transcripts), and a renamed copy is as likely a manifest
    listed twice (the same utterance trained twice) as a distinct utterance. The message names both
    cuts' sources, so the user can tell which case it is and fix the manifest. ``split`` names the
    split in messages.
    Audio: the file exists, is not empty, decodes at its start and at its end (a file cut short whose
    header still declares the whole length), is as long as the manifest says (truncation), is at the
    sample rate the manifest declares, a rate of recorded audio that resamples to ``expected_sample_rate``
    (``rate_problem``), and the cut lasts at least ``min_duration`` seconds (one
    feature frame: nothing shorter gives a feature). A recording source that is not a file (a lhotse
    ``command`` would run a shell command) raises ``BadInputError`` naming the cut, whatever
    ``on_bad`` says, before any audio is read. Files whose samples are floats are scanned for NaN/Inf,
    counted in ``report.non_finite`` and logged in one line (see ``_non_finite_samples``). Text: with
    ``require_text`` every cut has a non-empty transcript; any transcript present must be valid UTF-8.
    """
    if on_bad not in ("error", "skip"):
        raise ValueError(f"on_bad must be 'error' or 'skip', got {on_bad!r}")
    where = f" in split {split}" if split else ""
    if on_bad == "error":
        _refuse_duplicate_ids(cuts, where)
    report = ValidationReport()
    audio_checked: dict[str, Problem | None] = {}  # recording id -> its problem; cuts share recordings
    first_source: dict[str, str] = {}  # cut id -> the source of the first cut with it
    kept = []
    for cut in cuts:
        report.total += 1
        data = cut.to_dict()
        check_sources(data, cut.id, allow_urls=allow_urls)
        check_timing(data, cut.id, where=f"split {split}" if split else "the cuts")
        problem = None
        if cut.id in first_source:
            problem = Problem("duplicate cut id", cut.id, f"{_cut_source(cut)} has the id of {first_source[cut.id]}")
        else:
            first_source[cut.id] = _cut_source(cut)
        problem = problem or _text_problem(cut, require_text)
        if problem is None:
            rate = cut.has_recording and rate_problem(_source_sample_rate(cut.recording), expected_sample_rate)
            if not cut.has_recording:
                problem = Problem("missing recording", cut.id, "the cut has no recording in the manifest")
            elif rate:  # (a header's rate no recording has also makes its duration meaningless)
                problem = Problem("unusable sample rate", _rec_name(cut.recording), rate)
            elif cut.duration < min_duration:
                problem = Problem(
                    "too short",
                    _rec_name(cut.recording),
                    f"it lasts {1000 * cut.duration:.2f} ms, less than one {1000 * min_duration:g} ms feature frame",
                )
            else:
                rid = cut.recording.id
                if rid not in audio_checked:
                    audio_checked[rid] = _audio_problem(cut.recording)
                    if audio_checked[rid] is None:
                        bad = _non_finite_samples(cut.recording)
                        if bad:
                            report.non_finite[_rec_name(cut.recording)] = bad
                problem = audio_checked[rid]
        if problem is not None:
            if on_bad == "error":
                raise BadInputError(problem.kind, f"{problem.name} (cut {cut.id}{where})", problem.detail)
            report.problems.append(problem)
            continue
        kept.append(cut if cut.sampling_rate == expected_sample_rate else cut.resample(expected_sample_rate))
    if report.problems:
        log.warning("%s", report.summary())
    if report.non_finite:
        log.warning("%s", non_finite_summary(report.non_finite, split))
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


def _refuse_duplicate_ids(cuts: CutSet, where: str) -> None:
    """Raise ``BadInputError`` at the first id that two cuts share, naming both cuts' sources. Reads ids
    and paths only, so a manifest with duplicates is refused before any audio is read."""
    first_source: dict[str, str] = {}
    for cut in cuts:
        if cut.id not in first_source:
            first_source[cut.id] = _cut_source(cut)
            continue
        source = _cut_source(cut)
        same = (
            " (the same audio: is the manifest, or a part of it, listed twice?)"
            if source == first_source[cut.id]
            else ""
        )
        raise BadInputError(
            "duplicate cut id",
            f"cut {cut.id}{where}",
            f"two cuts have this id, one from {first_source[cut.id]} and one from {source}{same}; features, "
            "batches and results are keyed by cut id, so one of them would silently stand in for both",
            hint="give every cut its own id (e.g. prefix the ids of each corpus when merging manifests) or remove "
            "the extra one, or set data.on_bad_input=skip to keep the first and drop the others (with a summary)",
        )


def _cut_source(cut: Cut) -> str:
    """Where a cut's audio comes from, for messages: its file, with the cut's offset when it has one."""
    if not cut.has_recording:
        return "no recording"
    offset = f" at {cut.start:.2f} s" if cut.start > 0 else ""
    return f"{_rec_name(cut.recording)}{offset}"


def non_finite_summary(non_finite: dict[str, int], split: str | None = None, max_names: int = 3) -> str:
    """One line: which audio files hold NaN/Inf samples and what happens to them."""
    shown = ", ".join(f"{Path(name).name}: {n}" for name, n in list(non_finite.items())[:max_names])
    more = ", ..." if len(non_finite) > max_names else ""
    return (
        f"{split + ': ' if split else ''}{len(non_finite)} audio files hold NaN/Inf samples ({shown}{more}); "
        "their feature frames are set to the global mean in training and left out of the feature statistics, "
        "as usmkit-transcribe silences such samples (re-export the files to drop this warning)"
    )


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


def check_timing(data: dict, cut_id: str, *, where: str = "manifest") -> None:
    """Raise ``BadInputError`` naming ``cut_id`` and ``where`` (the manifest) if the cut dict ``data`` has a start
    or duration that is not a finite number (a JSON ``NaN`` or ``Infinity``), at any level (the cut, its
    supervisions, its recording), or a negative start or a duration not above zero of its own. lhotse does
    arithmetic on them far from here (``AssertionError``, ``cannot convert NaN to integer``)."""
    for item in _dicts_with(data, "duration"):
        for key in ("start", "duration", "offset"):
            value = item.get(key)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise BadInputError(
                    "bad timing",
                    f"cut {cut_id} in {where}",
                    f"its {_owner(item, data)}{key} is {value!r}, not a finite number of seconds",
                    hint="fix or remove the cut in the manifest (rebuild it with the recipe that made it)",
                )
    start, duration = data.get("start", 0.0), data.get("duration")
    if start < 0 or (duration is not None and duration <= 0):
        raise BadInputError(
            "bad timing",
            f"cut {cut_id} in {where}",
            f"it starts at {start!r} s and lasts {duration!r} s; a cut starts at 0 or later and lasts more than 0 s",
            hint="fix or remove the cut in the manifest (rebuild it with the recipe that made it)",
        )


def _owner(item: dict, cut: dict) -> str:
    """Whose field ``item`` holds, for messages: "" for the cut itself, else e.g. "supervision 's1' "."""
    if item is cut:
        return ""
    kind = "recording" if "sources" in item else "supervision" if "recording_id" in item else "part"
    return f"{kind} {item.get('id')!r} "


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
        header = _header_problem(path)  # a WAV cut short before its manifest entry was made
        if header is not None:
            return header
    try:
        rec.load_audio(offset=0.0, duration=min(PROBE_S, rec.duration))
    except Exception as e:
        return Problem("corrupt audio", _rec_name(rec), f"cannot decode it ({_first_line(e)})")
    return _tail_problem(rec)


def _header_problem(path: Path) -> Problem | None:
    """A WAV whose header declares more audio than the file holds (``declared_frames``; libsndfile, and so
    lhotse, report only what is there), found as ``usmkit-transcribe`` finds it. Reads the header only."""
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError):  # a format only another lhotse backend reads
        return None
    declared = declared_frames(info)
    if declared - info.frames <= DURATION_TOLERANCE_S * info.samplerate:
        return None
    return Problem(
        "truncated audio",
        str(path),
        f"its header declares {declared / info.samplerate:.3f} s but the file holds "
        f"{info.frames / info.samplerate:.3f} s (a copy cut short? copy it again)",
    )


def _tail_problem(rec: Recording) -> Problem | None:
    """A recording that does not decode to the end its header and manifest declare, as transcription
    finds it (``usmkit.streaming.audio.FileSource``), without decoding the whole file.

    A copy or download cut short keeps its header: a FLAC still declares every sample, so ``audio_info``
    and the probe of its start pass, and training fails only when it reaches the missing part. Reading
    the last ``PROBE_S`` seconds finds it: truncation removes a file's end, and the decoders seek there
    through the file's index or frame headers rather than by decoding what comes before, so a check
    costs one short decode per recording whatever its length. Corruption inside a file that still
    decodes at both ends is not found here; the feature cache reports it by cut
    (``usmkit.data.features.precompute_features``).
    """
    start = max(0.0, rec.duration - PROBE_S)
    want = rec.duration - start
    try:
        samples = rec.load_audio(offset=start, duration=want)
    except Exception:  # lhotse tried every backend (its message lists them all): a truncated FLAC fails to seek
        got = 0.0
    else:
        got = samples.shape[-1] / rec.sampling_rate
    if got < want - DURATION_TOLERANCE_S:
        return Problem(
            "truncated audio",
            _rec_name(rec),
            f"it does not decode to its end: its header or manifest declares {rec.duration:.3f} s but decoding "
            f"stops before {start + got:.3f} s (a copy cut short? copy it again)",
        )
    return None


def _non_finite_samples(rec: Recording) -> int:
    """NaN/Inf samples in ``rec``'s files, read block by block.

    Only files that store float samples (WAV/AIFF/CAF ``FLOAT``/``DOUBLE``) can hold them: integer PCM,
    FLAC and the compressed codecs decode to finite numbers by construction, so for almost every corpus
    this reads nothing but headers; a float file is read once, in full (its values are the question).
    """
    bad = 0
    for src in rec.sources:
        if src.type != "file":
            continue
        try:
            if sf.info(src.source).subtype not in FLOAT_SUBTYPES:
                continue
            for block in sf.blocks(src.source, blocksize=SCAN_BLOCK, dtype="float32"):
                bad += block.size - int(np.count_nonzero(np.isfinite(block)))
        except (sf.LibsndfileError, RuntimeError):  # not a libsndfile format: not a float PCM file either
            continue
    return bad


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
