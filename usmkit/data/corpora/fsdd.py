"""Free Spoken Digit Dataset (FSDD): real human speech, speaker-split manifests.

The corpus: ``{corpus_dir}/recordings/{digit}_{speaker}_{index}.wav``, 8 kHz mono, one spoken
digit per file (transcript: the English word, ``7`` -> ``"seven"``). The copy we use lives at
``/work/shared/data/fsdd`` (five speakers, 500 files each; see its README for the license).

Splits (corpus name ``fsdd``):

- ``test``: every recording of ``test_speakers`` (default ``theo``): a voice the model never heard.
- ``dev``: with ``dev_speakers`` given, every recording of those speakers; by default (no dev
  speakers) the takes with index 0-4 of the training speakers, FSDD's own documented held-out
  convention ("recordings numbered 0-4 are the test set"), so training keeps four speakers.
- ``train``: all other recordings, plus (``synth_takes=N``) N synthetic takes of every digit word
  from random espeak-ng voices, rendered like FSDD (8 kHz, trimmed; see ``fsdd_synth.py``): more
  voices than the four real training speakers. Dev and test stay real speech only.

Audio stays 8 kHz on disk; the manifests carry lhotse's lazy ``resample(16000)``, so every cut
loads at 16 kHz. Every file is decoded once; a bad one (empty, corrupt, truncated, NaN/Inf samples)
stops the recipe naming it (``on_error=fail``) or is left out and counted in the summary
(``on_error=skip``).

CLI: ``python -m usmkit.cli.prepare fsdd out=data/fsdd [corpus_dir=...] [test_speakers=theo]
[dev_speakers=lucas] [limit=N] [synth_takes=N] [synth_seed=S] [on_error=fail|skip]``
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet, MonoCut, SupervisionSegment

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import (
    CORPORA_ENV,
    OnError,
    RecipeDrops,
    RecipeError,
    checked_recording,
    default_corpus_dir,
    drops_footer,
    write_split,
)
from usmkit.data.corpora.fsdd_synth import plan_digit_takes, synthesize_digit_takes

CORPUS = "fsdd"
SAMPLE_RATE = 16000
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DEV_TAKES = range(5)  # FSDD's convention: takes 0-4 of each digit and speaker are held out
_FILE_NAME = re.compile(r"^(?P<digit>\d)_(?P<speaker>[A-Za-z]+)_(?P<index>\d+)\.wav$")


def default_fsdd_dir() -> Path:
    """``$USMKIT_CORPORA/fsdd`` (``default_corpus_dir``)."""
    return default_corpus_dir("fsdd")


@dataclass(frozen=True)
class FsddFile:
    path: Path
    digit: int
    speaker: str
    index: int

    @property
    def id(self) -> str:
        return f"{CORPUS}-{self.path.stem}"


def _recordings_dir(corpus_dir: Path) -> Path:
    for candidate in (corpus_dir / "recordings", corpus_dir):
        if candidate.is_dir() and any(candidate.glob("*.wav")):
            return candidate
    raise FileNotFoundError(
        f"no FSDD recordings (*.wav) in {corpus_dir} or {corpus_dir / 'recordings'}; pass corpus_dir=DIR "
        f"pointing at a Free Spoken Digit Dataset copy (corpus_dir=, or ${CORPORA_ENV}/fsdd)"
    )


def scan_fsdd(corpus_dir: Path, limit: int | None = None, drops: RecipeDrops | None = None) -> list[FsddFile]:
    """Every ``{digit}_{speaker}_{index}.wav``, sorted; ``limit`` keeps takes with index < limit. A file
    named otherwise stops the scan, or with ``drops`` in skip mode is left out and counted."""
    files = []
    for path in sorted(_recordings_dir(corpus_dir).glob("*.wav")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            if drops is not None and drops.on_error == "skip":
                drops.seen()
                drops.drop("unexpected file name", str(path), "not {digit}_{speaker}_{index}.wav")
                continue
            raise RecipeError(
                f"{path}: FSDD file names must look like '{{digit}}_{{speaker}}_{{index}}.wav' (e.g. 7_theo_12.wav); "
                "move other files out of the recordings directory, or pass on_error=skip to leave them out"
            )
        item = FsddFile(path, int(match["digit"]), match["speaker"], int(match["index"]))
        if limit is None or item.index < limit:
            files.append(item)
    return files


def _assign(item: FsddFile, test_speakers: set[str], dev_speakers: set[str]) -> str:
    if item.speaker in test_speakers:
        return "test"
    if dev_speakers:
        return "dev" if item.speaker in dev_speakers else "train"
    return "dev" if item.index in DEV_TAKES else "train"


def _check_speakers(found: set[str], test_speakers: set[str], dev_speakers: set[str]) -> None:
    for name, chosen in (("test_speakers", test_speakers), ("dev_speakers", dev_speakers)):
        unknown = chosen - found
        if unknown:
            raise RecipeError(f"{name} {sorted(unknown)} are not in the corpus; its speakers are {sorted(found)}")
    if not test_speakers:
        raise RecipeError(f"test_speakers must name at least one speaker of {sorted(found)}")
    both = test_speakers & dev_speakers
    if both:
        raise RecipeError(f"speakers {sorted(both)} are in both test_speakers and dev_speakers; pick one split each")
    if not found - test_speakers - dev_speakers:
        raise RecipeError(
            f"no training speaker left: corpus speakers {sorted(found)}, test {sorted(test_speakers)}, dev {sorted(dev_speakers)}"
        )


def _cut(path: Path, cut_id: str, digit: int, speaker: str, drops: RecipeDrops) -> MonoCut | None:
    """One spoken digit (a real FSDD file or a synthetic take), resampled to 16 kHz when loaded;
    None when the file is bad and ``drops`` skips it."""
    recording = checked_recording(path, cut_id, drops)
    if recording is None:
        return None
    recording = recording.resample(SAMPLE_RATE)
    supervision = SupervisionSegment(
        id=cut_id,
        recording_id=cut_id,
        start=0.0,
        duration=recording.duration,
        channel=0,
        text=DIGIT_WORDS[digit],
        language="en",
        speaker=speaker,
    )
    return MonoCut(cut_id, 0.0, recording.duration, 0, recording=recording, supervisions=[supervision])


def prepare_fsdd(
    corpus_dir: str | Path | None = None,
    out_dir: str | Path = Path("data/fsdd"),
    test_speakers: Sequence[str] = ("theo",),
    dev_speakers: Sequence[str] = (),
    limit: int | None = None,
    synth_takes: int = 0,
    synth_seed: int = 0,
    workers: int = 2,
    on_error: OnError = "fail",
    drops: RecipeDrops | None = None,
) -> dict[str, CutSet]:
    """Write ``fsdd_{recordings,supervisions,cuts}_{train,dev,test}.jsonl.gz`` to ``out_dir``.

    ``corpus_dir`` defaults to :func:`default_fsdd_dir`. ``limit`` (tests) keeps only takes with
    index < limit of every digit and speaker. ``synth_takes`` > 0 adds that many synthetic takes of
    each digit word to ``train`` (files under ``out_dir/synth_digits``, rendered by ``workers``
    processes). Files left out (``on_error=skip``) are counted in ``drops``. Returns the CutSets by split.
    """
    drops = drops if drops is not None else RecipeDrops(on_error)
    corpus_dir = Path(corpus_dir) if corpus_dir is not None else default_fsdd_dir()
    if limit is not None and limit < 1:
        raise RecipeError(f"limit must be >= 1 (takes per digit and speaker) or None, got {limit}")
    if synth_takes < 0:
        raise RecipeError(f"synth_takes must be >= 0 (synthetic takes per digit; 0 = none), got {synth_takes}")
    files = scan_fsdd(corpus_dir, limit, drops)
    test_set, dev_set = set(test_speakers), set(dev_speakers)
    _check_speakers({f.speaker for f in files}, test_set, dev_set)
    by_split: dict[str, list[MonoCut]] = {"train": [], "dev": [], "test": []}
    for item in files:
        cut = _cut(item.path, item.id, item.digit, item.speaker, drops)
        if cut is not None:
            by_split[_assign(item, test_set, dev_set)].append(cut)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if synth_takes:
        takes = plan_digit_takes(DIGIT_WORDS, synth_takes, synth_seed)
        written = synthesize_digit_takes(out_dir / "synth_digits", takes, synth_seed, workers)
        synth_cuts = [_cut(path, f"{CORPUS}-{take.stem}", take.digit, take.speaker, drops) for take, path in written]
        by_split["train"] += [c for c in synth_cuts if c is not None]
    result = {}
    for split, cuts in by_split.items():
        if not cuts:
            raise RecipeError(f"split {split!r} is empty (limit={limit}); raise limit or change the speaker split")
        cut_set = CutSet.from_cuts(cuts)
        write_split(out_dir, CORPUS, split, cut_set)
        result[split] = cut_set
    return result


@dataclass(frozen=True)
class FsddArgs:
    out: Path = Path("data/fsdd")
    corpus_dir: str = ""  # empty: <repo>/../shared/data/fsdd
    test_speakers: str = "theo"  # comma-separated
    dev_speakers: str = ""  # comma-separated; empty: takes 0-4 of the training speakers
    limit: int | None = None
    synth_takes: int = 0
    synth_seed: int = 0
    workers: int = 2
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare fsdd [key=value ...]

  out=PATH               output directory (default data/fsdd)
  corpus_dir=PATH        FSDD copy (default <repo>/../shared/data/fsdd)
  test_speakers=a,b      held-out test speakers (default theo)
  dev_speakers=a,b       dev speakers (default none: takes 0-4 of the training speakers)
  limit=N                keep only takes 0..N-1 of each digit and speaker
  synth_takes=N          add N synthetic takes of each digit (random espeak-ng voices) to train
  synth_seed=S           seed of the synthetic voices (default 0)
  workers=N              processes rendering the synthetic takes (default 2)
  on_error=fail|skip     stop at the first bad file (default) or leave bad files out, counted in the summary
"""


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def run(args: FsddArgs) -> None:
    """``python -m usmkit.cli.prepare fsdd key=value ...`` (``USAGE``)."""
    drops = RecipeDrops(args.on_error)  # type: ignore[arg-type]  (checked there)
    cut_sets = prepare_fsdd(
        corpus_dir=args.corpus_dir or None,
        out_dir=args.out,
        test_speakers=_names(args.test_speakers),
        dev_speakers=_names(args.dev_speakers),
        limit=args.limit,
        synth_takes=args.synth_takes,
        synth_seed=args.synth_seed,
        workers=args.workers,
        drops=drops,
    )
    print_split_table(f"fsdd manifests in {args.out}", split_rows(cut_sets), footer=drops_footer(drops))


ARGS = FsddArgs
