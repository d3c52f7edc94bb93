"""Kathleen: one human speaker reading the CMU ARCTIC prompts (CC0), split by prompt.

The corpus (the project's copy is ``<repo>/../shared/data/kathleen``)::

    data/arctic_a0001_1592748574.flac    16 kHz mono; ``.opus``/``.ogg`` in a copy from ``recipes.pack``
    data/arctic_a0001_1592748574.txt     its transcript, original casing and punctuation

The id is ``arctic_<a|b><NNNN>_<timestamp>``; ids sharing ``arctic_a0001`` are takes of one prompt.

Splits (corpus name ``kathleen``), by prompt so that no sentence is heard in two splits: each prompt
goes to ``train``, ``dev`` or ``test`` by a hash of its id (SHA-256, buckets of 100: 80/10/10), so
the split of a prompt never depends on which other files are present. ``unlabeled`` is the ``train``
audio without transcripts (speaker and language in ``cut.custom``), for BEST-RQ pre-training.

Transcripts: lowercase words with apostrophes kept inside words and dropped at their edges (as the
WER normalization of ``usmkit.metrics`` does: ``don't``, ``c's``, ``'em`` -> ``em``; the LibriSpeech
recipe keeps them too), punctuation and hyphens turned into spaces, and
the prompts' three abbreviations written as read: ``Mr`` -> ``mister``, ``Mrs`` -> ``missus``,
``etc`` -> ``et cetera``. The ARCTIC prompts write their numbers as words; a transcript holding a digit
is bad input (``digits in transcript``), since its words would be a guess.

Every audio file is decoded to the end once. Bad input (corrupt, empty or truncated audio, audio
without a ``.txt``, a ``.txt`` without audio, an empty or non-UTF-8 transcript, a file name that is
not an ARCTIC id) stops the recipe naming the file (``on_error=fail``) or is left out and counted in
the summary (``on_error=skip``).

CLI: ``python -m usmkit.cli.prepare kathleen out=data/kathleen [corpus_dir=...] [num_jobs=1]
[on_error=fail|skip]``
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import (
    CORPORA_ENV,
    OnError,
    RecipeDrops,
    RecipeError,
    checked_recording,
    default_corpus_dir,
    drops_footer,
    unlabeled_cuts,
    write_split,
    write_unlabeled_split,
)
from usmkit.data.validate import BadInputError, read_transcript
from usmkit.metrics import normalize_text

CORPUS = "kathleen"
SPEAKER = "kathleen"
SAMPLE_RATE = 16000
AUDIO_SUFFIXES = (".flac", ".opus", ".ogg")
SPLIT_PERCENT = (("train", 80), ("dev", 10), ("test", 10))  # shares of the prompts
ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "etc": "et cetera"}
_ID = re.compile(r"^(?P<prompt>arctic_[ab]\d{4})_(?P<take>\d+)$")


def default_kathleen_dir() -> Path:
    """``$USMKIT_CORPORA/kathleen`` (``default_corpus_dir``)."""
    return default_corpus_dir("kathleen")


def normalize_kathleen(text: str) -> str:
    """A prompt as the words spoken: lowercase, punctuation out, in-word apostrophes kept, abbreviations read.

    >>> normalize_kathleen("Mrs McFee's jaws -- it's the wolf-dog, etc.")
    "missus mcfee's jaws it's the wolf dog et cetera"
    """
    words = normalize_text(text).split()
    return " ".join(ABBREVIATIONS.get(w, w) for w in words if w)


def prompt_split(prompt: str) -> str:
    """``train``, ``dev`` or ``test`` for a prompt id, from a hash of the id alone (stable everywhere).

    >>> prompt_split("arctic_a0001")
    'dev'
    """
    bucket = int.from_bytes(hashlib.sha256(f"{CORPUS}:{prompt}".encode()).digest()[:8], "big") % 100
    for split, percent in SPLIT_PERCENT:
        if bucket < percent:
            return split
        bucket -= percent
    raise AssertionError("SPLIT_PERCENT must sum to 100")


@dataclass(frozen=True)
class KathleenTake:
    id: str  # arctic_a0001_1592748574
    prompt: str  # arctic_a0001
    text: str  # normalized
    audio: Path


def _data_dir(corpus_dir: Path) -> Path:
    for candidate in (corpus_dir / "data", corpus_dir):
        if candidate.is_dir() and any(p.suffix in AUDIO_SUFFIXES for p in candidate.iterdir()):
            return candidate
    raise FileNotFoundError(
        f"no Kathleen audio (*.flac, *.opus, *.ogg) in {corpus_dir / 'data'} or {corpus_dir}; pass corpus_dir=DIR "
        f"(corpus_dir=, or ${CORPORA_ENV}/kathleen)"
    )


def scan_kathleen(corpus_dir: Path, drops: RecipeDrops) -> list[KathleenTake]:
    """Every take with audio and a usable transcript, sorted by id; the rest goes to ``drops``."""
    data_dir = _data_dir(corpus_dir)
    audio: dict[str, Path] = {}
    texts: dict[str, Path] = {}
    for path in sorted(data_dir.iterdir()):
        if path.suffix == ".txt":
            texts[path.stem] = path
        elif path.suffix in AUDIO_SUFFIXES:
            audio.setdefault(path.stem, path)  # .flac before .ogg before .opus (sorted names)
    takes = []
    for stem in sorted(set(audio) | set(texts)):
        name = str(audio.get(stem) or texts[stem])
        match = _ID.match(stem)
        if match is None:
            drops.seen()
            drops.drop("unexpected file name", name, "not arctic_<a|b><NNNN>_<timestamp>.{flac,txt}")
            continue
        if stem not in audio:
            drops.seen()
            drops.drop("missing audio", name, f"no {stem}.flac (or .opus/.ogg) for this transcript")
            continue
        if stem not in texts:
            drops.seen()
            drops.drop("audio without transcript", name, f"no {stem}.txt next to it")
            continue
        try:
            raw = read_transcript(texts[stem])
        except BadInputError as e:
            drops.seen()
            drops.drop(e.kind, e.where, e.detail)
            continue
        text = normalize_kathleen(raw)
        if not text:
            drops.seen()
            drops.drop("empty transcript", str(texts[stem]), "the file holds no words")
            continue
        if any(ch.isdigit() for ch in text):
            drops.seen()
            drops.drop("digits in transcript", str(texts[stem]), f"{raw!r}: write the numbers as words")
            continue
        takes.append(KathleenTake(stem, match["prompt"], text, audio[stem]))
    return takes


def _cut(take: KathleenTake, recording: Recording) -> MonoCut:
    supervision = SupervisionSegment(
        id=take.id,
        recording_id=take.id,
        start=0.0,
        duration=recording.duration,
        channel=0,
        text=take.text,
        language="en",
        speaker=SPEAKER,
        custom={"prompt": take.prompt},
    )
    return MonoCut(take.id, 0.0, recording.duration, 0, recording=recording, supervisions=[supervision])


def prepare_kathleen(
    corpus_dir: str | Path | None = None,
    out_dir: str | Path = Path("data/kathleen"),
    num_jobs: int = 1,
    on_error: OnError = "fail",
    drops: RecipeDrops | None = None,
) -> dict[str, CutSet]:
    """Write ``kathleen_{recordings,supervisions,cuts}_{train,dev,test}.jsonl.gz`` and
    ``kathleen_{recordings,cuts}_unlabeled.jsonl.gz`` to ``out_dir``; returns the CutSets by split.

    ``corpus_dir`` defaults to :func:`default_kathleen_dir`. Files left out (``on_error=skip``) are
    counted in ``drops`` (made from ``on_error`` when not given)."""
    drops = drops if drops is not None else RecipeDrops(on_error)
    corpus_dir = Path(corpus_dir) if corpus_dir is not None else default_kathleen_dir()
    takes = scan_kathleen(corpus_dir, drops)

    def load(take: KathleenTake) -> Recording | None:
        recording = checked_recording(take.audio, take.id, drops)
        if recording is not None and recording.sampling_rate != SAMPLE_RATE:
            recording = recording.resample(SAMPLE_RATE)
        return recording

    with ThreadPoolExecutor(max(1, num_jobs)) as pool:
        recordings = list(pool.map(load, takes))
    by_split: dict[str, list[MonoCut]] = {split: [] for split, _ in SPLIT_PERCENT}
    for take, recording in zip(takes, recordings, strict=True):
        if recording is not None:
            by_split[prompt_split(take.prompt)].append(_cut(take, recording))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for split, cuts in by_split.items():
        if not cuts:
            raise RecipeError(f"Kathleen split {split!r} is empty ({drops.summary()}); check corpus_dir={corpus_dir}")
        result[split] = CutSet.from_cuts(cuts)
        write_split(out_dir, CORPUS, split, result[split])
    result["unlabeled"] = unlabeled_cuts(result["train"], language="en")
    write_unlabeled_split(out_dir, CORPUS, "unlabeled", result["unlabeled"])
    return result


def prompts_line(cut_sets: Mapping[str, CutSet]) -> str:
    counts = {
        split: len({s.custom["prompt"] for c in cut_sets[split] for s in c.supervisions}) for split, _ in SPLIT_PERCENT
    }
    return "prompts: " + ", ".join(f"{split} {n}" for split, n in counts.items())


@dataclass(frozen=True)
class KathleenArgs:
    out: Path = Path("data/kathleen")
    corpus_dir: str = ""  # empty: <repo>/../shared/data/kathleen
    num_jobs: int = 1
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare kathleen [key=value ...]

  out=PATH               output directory (default data/kathleen)
  corpus_dir=PATH        Kathleen copy holding data/*.flac|opus|ogg + data/*.txt (default <repo>/../shared/data/kathleen)
  num_jobs=N             reader threads (default 1)
  on_error=fail|skip     stop at the first bad file (default) or leave bad files out, counted in the summary
"""


def run(args: KathleenArgs) -> None:
    """``python -m usmkit.cli.prepare kathleen key=value ...`` (``USAGE``)."""
    drops = RecipeDrops(args.on_error)  # type: ignore[arg-type]  (checked there)
    cut_sets = prepare_kathleen(
        corpus_dir=args.corpus_dir or None, out_dir=args.out, num_jobs=args.num_jobs, drops=drops
    )
    footer = drops_footer(drops, [prompts_line(cut_sets)])
    print_split_table(f"kathleen manifests in {args.out}", split_rows(cut_sets), footer=footer)


ARGS = KathleenArgs
