"""Bad input in corpus recipes: every dropped or skipped item is counted and reported.

A recipe makes one ``RecipeDrops`` per run and passes it to what reads files. With
``on_error="fail"`` (the default) the first bad item raises ``BadInputError`` naming the file and
what to do; with ``on_error="skip"`` it is left out, counted, and listed in the summary the recipe
prints, so one corrupt file does not stop a whole corpus::

    drops = RecipeDrops(on_error=args.on_error)
    for path in wav_files:
        recording = checked_recording(path, path.stem, drops)  # None: bad and skipped (counted)
        if recording is None:
            continue
        if path.stem not in transcripts:
            drops.drop("missing transcript", str(path), "no line for it in the transcript file")
            continue
        ...
    write_split(out_dir, "mycorpus", "train", cuts)  # manifests; paths under out_dir stored relative to it
    print(drops.summary())  # "skipped 2 of 512 files: 1 corrupt audio (a.flac), 1 missing transcript (b.flac)"
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSet

from usmkit.data.manifests import manifest_path, write_manifest
from usmkit.data.validate import BadInputError, Problem, ValidationReport
from usmkit.errors import UsageError

log = logging.getLogger(__name__)

OnError = Literal["fail", "skip"]
ON_ERROR_HINT = "fix or remove it, or pass on_error=skip to leave such items out (they are counted in the summary)"


class RecipeError(UsageError, ValueError):
    """A recipe argument or corpus layout that cannot be used; the message says what to pass instead."""


class RecipeDrops:
    """Counts the items a recipe looked at (``seen``) and the ones it left out (``drop``), thread-safe."""

    def __init__(self, on_error: OnError = "fail", unit: str = "files") -> None:
        if on_error not in ("fail", "skip"):
            raise BadInputError("bad argument", f"on_error={on_error!r}", "must be 'fail' or 'skip'", hint="pick one")
        self.on_error = on_error
        self.report = ValidationReport(unit=unit)
        self._lock = threading.Lock()

    def seen(self, n: int = 1) -> None:
        with self._lock:
            self.report.total += n

    def drop(self, kind: str, name: str, detail: str) -> None:
        """Leave one item out: raise with ``on_error="fail"``, else count it for the summary."""
        if self.on_error == "fail":
            raise BadInputError(kind, name, detail, hint=ON_ERROR_HINT)
        with self._lock:
            self.report.problems.append(Problem(kind, name, detail))
        log.warning("skipped %s: %s (%s)", name, kind, detail)

    @property
    def num_dropped(self) -> int:
        return self.report.num_skipped

    def counts(self) -> dict[str, int]:
        """Dropped items by kind, e.g. ``{"corrupt audio": 1, "missing transcript": 3}``."""
        out: dict[str, int] = {}
        for p in self.report.problems:
            out[p.kind] = out.get(p.kind, 0) + 1
        return out

    def summary(self) -> str:
        return self.report.summary()


def checked_recording(
    path: str | os.PathLike[str], recording_id: str, drops: RecipeDrops, *, decode: bool = True
) -> Recording | None:
    """``Recording.from_file(path)``, or None (counted in ``drops``) when the file is missing, empty,
    unreadable, cut short (it does not decode to the end, with ``decode``) or holds NaN/Inf samples."""
    path = Path(path)
    drops.seen()
    if not path.is_file():
        drops.drop("missing audio", str(path), "the file does not exist")
        return None
    if path.stat().st_size == 0:
        drops.drop("empty audio", str(path), "the file has 0 bytes")
        return None
    try:
        recording = Recording.from_file(path, recording_id=recording_id)
    except Exception as e:  # lhotse tries every backend; any failure means the file is not usable audio
        drops.drop("corrupt audio", str(path), f"cannot read it as audio ({_first_line(e)})")
        return None
    if decode:
        try:
            samples = recording.load_audio()
        except Exception as e:
            drops.drop("corrupt audio", str(path), f"it does not decode to the end ({_first_line(e)})")
            return None
        bad = int(samples.size - np.isfinite(samples).sum())
        if bad:
            drops.drop("non-finite audio", str(path), f"{bad} samples are NaN or Inf")
            return None
    return recording


def write_split(
    out_dir: str | os.PathLike[str],
    corpus: str,
    split: str,
    cuts: CutSet,
    *,
    recordings: RecordingSet | None = None,
    supervisions: SupervisionSet | None = None,
) -> None:
    """``{corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz`` in ``out_dir`` (``write_manifest``: paths
    under ``out_dir`` relative to it, others absolute).

    Recordings and supervisions default to those of ``cuts``."""
    if recordings is None:
        recordings = RecordingSet.from_recordings(c.recording for c in cuts)
    if supervisions is None:
        supervisions = SupervisionSet.from_segments(s for c in cuts for s in c.supervisions)
    write_manifest(recordings, manifest_path(out_dir, corpus, "recordings", split))
    write_manifest(supervisions, manifest_path(out_dir, corpus, "supervisions", split))
    write_manifest(cuts, manifest_path(out_dir, corpus, "cuts", split))


def drops_footer(drops: RecipeDrops, extra: Sequence[str] = ()) -> str:
    """The line a recipe prints under its table: what it left out, by kind (or that it left out nothing)."""
    return "; ".join([drops.summary(), *extra])


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


CORPORA_ENV = "USMKIT_CORPORA"  # the folder holding local corpus copies (an4/, kathleen/, fsdd/, ...)


def default_corpus_dir(name: str) -> Path:
    """``$USMKIT_CORPORA/<name>``: the corpus copy a recipe reads when no ``corpus_dir=`` is given.
    ``RecipeError`` when the variable is not set."""
    root = os.environ.get(CORPORA_ENV)
    if not root:
        raise RecipeError(
            f"no {name} copy given: pass corpus_dir=PATH (a local copy of the corpus), or set {CORPORA_ENV} "
            f"to the folder that holds {name}/"
        )
    return Path(root) / name


def unlabeled_cuts(cuts: CutSet, language: str, id_prefix: str = "") -> CutSet:
    """The same audio without transcripts (BEST-RQ pre-training): each cut's supervisions dropped, its
    speaker and language kept in ``cut.custom`` (as the synthetic corpus's ``unlabeled`` split; a cut that
    is audio-only already keeps its own), ``language`` where none is known; ids get ``id_prefix``."""
    out = []
    for cut in cuts:
        sup = next((s for s in cut.supervisions if s.speaker), None)
        custom = dict(cut.custom or {})
        custom["speaker"] = sup.speaker if sup else custom.get("speaker")
        custom["language"] = (sup.language if sup else None) or custom.get("language") or language
        cut_id = id_prefix + cut.id
        out.append(MonoCut(cut_id, cut.start, cut.duration, cut.channel, recording=cut.recording, custom=custom))
    return CutSet.from_cuts(out)


def write_unlabeled_split(out_dir: str | os.PathLike[str], corpus: str, split: str, cuts: CutSet) -> None:
    """``{corpus}_{recordings,cuts}_{split}.jsonl.gz`` for audio-only cuts (no supervisions manifest)."""
    recordings = RecordingSet.from_recordings(c.recording for c in cuts)
    write_manifest(recordings, manifest_path(out_dir, corpus, "recordings", split))
    write_manifest(cuts, manifest_path(out_dir, corpus, "cuts", split))
