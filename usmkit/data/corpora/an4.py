"""CMU AN4 (census): real read and spelled speech, speaker-disjoint train/dev/test manifests.

The corpus (the standard distribution; the project's copy is ``<repo>/../shared/data/an4``)::

    wav/an4_clstk/<speaker>/<utt>.sph        training set, 948 utterances of 74 speakers
    wav/an4test_clstk/<speaker>/<utt>.sph    test set, 130 utterances of 10 speakers
    etc/an4_{train,test}.fileids             one ``an4_clstk/fash/an251-fash-b`` per line
    etc/an4_{train,test}.transcription       ``<s> TEXT </s> (utt-id)`` (train) / ``TEXT (utt-id)`` (test)

The same layout with ``.flac``, ``.opus`` or ``.ogg`` files instead of ``.sph`` (a copy written by
``usmkit.data.corpora.pack``) is read as well. ``etc/an4.dic`` and ``etc/an4.ug.lm`` are never read:
they were built from the whole corpus, test set included.

Splits (corpus name ``an4``):

- ``test``: the 130 test utterances.
- ``dev``: every utterance of some training speakers, held out of ``train``: speakers drawn in a
  fixed seeded order whose utterances total exactly ``dev_utterances`` (default 100, as ESPnet's
  ``train_dev``; the closest reachable total when no subset sums to it exactly).
- ``train``: the other training utterances (848 of 948).
- ``unlabeled``: the ``train`` audio without transcripts (speaker and language in ``cut.custom``),
  for BEST-RQ pre-training.

Transcripts: the sentence marks ``<s>``/``</s>``, Sphinx fillers (``<sil>``, ``++NOISE++``) dropped,
then lowercase words (``normalize_text``): spelled letters stay one-letter words
(``RUBOUT G M E F THREE NINE`` -> ``rubout g m e f three nine``). The speaker is the middle part of
the utterance id (``an251-fash-b`` -> ``fash``).

Audio: ``.sph`` files are decoded with libsndfile and checked against their header (see
``sphere.py``: lhotse would need the ``sph2pipe`` binary for them), then stored losslessly as FLAC
under ``{out}/audio/`` so the manifests point at files every lhotse backend reads; ``.flac``/``.opus``/
``.ogg`` files are decoded to the end once and referenced where they are. Bad input (a corrupt, empty or
truncated file, a transcript line without an id, a listed utterance without audio, audio or fileids
without a transcript) stops the recipe naming the file (``on_error=fail``) or is left out and counted
(``on_error=skip``).

CLI: ``python -m usmkit.cli.prepare an4 out=data/an4 [corpus_dir=...] [dev_utterances=100]
[dev_seed=0] [num_jobs=1] [on_error=fail|skip]``
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.data.audio_files import write_audio
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
from usmkit.data.corpora.sphere import SphereError, read_sphere
from usmkit.metrics import normalize_text

CORPUS = "an4"
SAMPLE_RATE = 16000
AUDIO_SUFFIXES = (".sph", ".flac", ".opus", ".ogg")  # first found wins
PARTS = {"train": "an4_train", "test": "an4_test"}  # part -> etc/{name}.fileids / .transcription
DEV_UTTERANCES = 100
_LINE = re.compile(r"^(?P<text>.*?)\s*\((?P<id>[^()\s]+)\)\s*$")
_MARKUP = re.compile(r"</?s>|<[^<>\s]*>|\+\+[^+\s]*\+\+")  # <s> </s>, <sil>, ++NOISE++
_UTT_ID = re.compile(r"^[^-]+-(?P<speaker>[^-]+)-[^-]+$")  # an251-fash-b


def default_an4_dir() -> Path:
    """``$USMKIT_CORPORA/an4`` (``default_corpus_dir``)."""
    return default_corpus_dir("an4")


def normalize_an4(text: str) -> str:
    """AN4 transcript -> words: markup and fillers dropped, lowercase, spelled letters kept.

    >>> normalize_an4("<s> RUBOUT G M E F THREE NINE </s>")
    'rubout g m e f three nine'
    >>> normalize_an4("<sil> ENTER ++BREATH++ SIX")
    'enter six'
    """
    return normalize_text(_MARKUP.sub(" ", text))


def speaker_of(utt_id: str, fileid: str) -> str:
    """``an251-fash-b`` -> ``fash``; the fileid's folder when the id has another form."""
    match = _UTT_ID.match(utt_id)
    return match["speaker"] if match else Path(fileid).parent.name


@dataclass(frozen=True)
class An4Utterance:
    id: str  # an251-fash-b
    fileid: str  # an4_clstk/fash/an251-fash-b (relative to wav/, no suffix)
    speaker: str
    text: str  # normalized
    audio: Path


def read_transcription(path: Path, drops: RecipeDrops) -> dict[str, str]:
    """``{utt_id: normalized text}`` of an ``an4_*.transcription`` file; bad lines go to ``drops``."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            drops.seen()
            drops.drop("non-UTF-8 transcript", where, f"byte 0x{raw[e.start]:02x} is not valid UTF-8")
            continue
        match = _LINE.match(line.strip())
        if match is None:
            drops.seen()
            drops.drop("transcript line without id", where, f"{line.strip()[:60]!r} does not end in '(utt-id)'")
            continue
        utt_id, text = match["id"], normalize_an4(match["text"])
        if utt_id in out:
            drops.seen()
            drops.drop("duplicate transcript", where, f"a second line for {utt_id!r}")
            continue
        if not text:
            drops.seen()
            drops.drop("empty transcript", where, f"utterance {utt_id!r} has no words")
            continue
        out[utt_id] = text
    return out


def _find_audio(wav_dir: Path, fileid: str) -> Path | None:
    for suffix in AUDIO_SUFFIXES:
        path = wav_dir / f"{fileid}{suffix}"
        if path.is_file():
            return path
    return None


def scan_part(corpus_dir: Path, part: str, drops: RecipeDrops) -> list[An4Utterance]:
    """The utterances of ``etc/{part}.fileids`` that have audio and a transcript, in fileids order;
    every other listed, transcribed or found item is counted in ``drops``."""
    etc, wav_dir = corpus_dir / "etc", corpus_dir / "wav"
    fileids_path, trans_path = etc / f"{part}.fileids", etc / f"{part}.transcription"
    for path in (fileids_path, trans_path):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; pass corpus_dir=DIR, an AN4 copy holding etc/{part}.fileids, "
                f"etc/{part}.transcription and wav/ (corpus_dir=, or ${CORPORA_ENV}/an4)"
            )
    texts = read_transcription(trans_path, drops)
    fileids = [line.strip() for line in fileids_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    utterances, listed = [], set()
    for fileid in fileids:
        utt_id = Path(fileid).name
        listed.add(fileid)
        audio = _find_audio(wav_dir, fileid)
        if audio is None:
            drops.seen()
            drops.drop(
                "missing audio",
                str(wav_dir / f"{fileid}.sph"),
                f"listed in {fileids_path.name}, no .sph/.flac/.opus/.ogg file",
            )
            continue
        if utt_id not in texts:
            drops.seen()
            drops.drop("audio without transcript", str(audio), f"{trans_path.name} has no line for {utt_id!r}")
            continue
        utterances.append(An4Utterance(utt_id, fileid, speaker_of(utt_id, fileid), texts[utt_id], audio))
    for utt_id in sorted(set(texts) - {Path(f).name for f in fileids}):
        drops.seen()
        drops.drop("transcript without audio", str(trans_path), f"{utt_id!r} is not listed in {fileids_path.name}")
    folders = {Path(f).parts[0] for f in fileids}
    for folder in sorted(folders):
        for path in sorted(p for p in (wav_dir / folder).rglob("*") if p.suffix in AUDIO_SUFFIXES):
            if path.relative_to(wav_dir).with_suffix("").as_posix() not in listed:
                drops.seen()
                drops.drop("audio not in fileids", str(path), f"{fileids_path.name} does not list it")
    return utterances


def load_recording(utt: An4Utterance, audio_dir: Path, drops: RecipeDrops) -> Recording | None:
    """The utterance's recording at 16 kHz, or None (counted) when its file is bad. A ``.sph`` file is
    decoded and checked (``read_sphere``) and stored as ``{audio_dir}/{fileid}.flac``."""
    if utt.audio.suffix != ".sph":
        recording = checked_recording(utt.audio, utt.id, drops)
    else:
        drops.seen()
        if utt.audio.stat().st_size == 0:
            drops.drop("empty audio", str(utt.audio), "the file has 0 bytes")
            return None
        try:
            samples, rate = read_sphere(utt.audio)
        except SphereError as e:
            drops.drop("corrupt audio", str(utt.audio), str(e))
            return None
        flac = audio_dir / f"{utt.fileid}.flac"
        write_audio(flac, samples, rate, format="FLAC", subtype="PCM_16")
        recording = Recording.from_file(flac, recording_id=utt.id)
    if recording is not None and recording.sampling_rate != SAMPLE_RATE:
        recording = recording.resample(SAMPLE_RATE)
    return recording


def choose_dev_speakers(counts: Mapping[str, int], target: int, seed: int = 0) -> tuple[str, ...]:
    """Speakers whose utterance counts sum to ``target`` (the closest reachable sum, smaller on a tie,
    when none does), never all of them: the first such subset in a seeded shuffle of the speakers.

    >>> choose_dev_speakers({"a": 13, "b": 13, "c": 9, "d": 12}, target=25)
    ('a', 'd')
    """
    if len(counts) < 2:
        raise RecipeError(f"a speaker-disjoint dev split needs at least 2 training speakers, found {sorted(counts)}")
    order = sorted(counts)
    random.Random(seed).shuffle(order)
    total = sum(counts.values())
    # reach[i]: sums reachable with a subset of order[i:]
    reach: list[set[int]] = [set() for _ in range(len(order) + 1)]
    reach[-1] = {0}
    for i in reversed(range(len(order))):
        reach[i] = reach[i + 1] | {s + counts[order[i]] for s in reach[i + 1]}
    goal = min((s for s in reach[0] if 0 < s < total), key=lambda s: (abs(s - target), s))
    chosen, remaining = [], goal
    for i, speaker in enumerate(order):
        n = counts[speaker]
        if remaining and n <= remaining and remaining - n in reach[i + 1]:
            chosen.append(speaker)
            remaining -= n
    return tuple(sorted(chosen))


def _cut(utt: An4Utterance, recording: Recording) -> MonoCut:
    supervision = SupervisionSegment(
        id=utt.id,
        recording_id=utt.id,
        start=0.0,
        duration=recording.duration,
        channel=0,
        text=utt.text,
        language="en",
        speaker=utt.speaker,
    )
    return MonoCut(utt.id, 0.0, recording.duration, 0, recording=recording, supervisions=[supervision])


def prepare_an4(
    corpus_dir: str | Path | None = None,
    out_dir: str | Path = Path("data/an4"),
    dev_utterances: int = DEV_UTTERANCES,
    dev_seed: int = 0,
    num_jobs: int = 1,
    on_error: OnError = "fail",
    drops: RecipeDrops | None = None,
) -> dict[str, CutSet]:
    """Write ``an4_{recordings,supervisions,cuts}_{train,dev,test}.jsonl.gz`` and
    ``an4_{recordings,cuts}_unlabeled.jsonl.gz`` to ``out_dir``; returns the CutSets by split.

    ``corpus_dir`` defaults to :func:`default_an4_dir`. Files left out (``on_error=skip``) are counted
    in ``drops`` (made from ``on_error`` when not given)."""
    drops = drops if drops is not None else RecipeDrops(on_error)
    corpus_dir = Path(corpus_dir) if corpus_dir is not None else default_an4_dir()
    if not (corpus_dir / "etc").is_dir():
        raise FileNotFoundError(
            f"{corpus_dir} holds no etc/ folder; pass corpus_dir=DIR, an AN4 copy with etc/ and wav/ "
            f"(corpus_dir=, or ${CORPORA_ENV}/an4)"
        )
    if dev_utterances < 1:
        raise RecipeError(f"dev_utterances must be >= 1, got {dev_utterances}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuts: dict[str, list[MonoCut]] = {}
    for part, name in PARTS.items():
        utterances = scan_part(corpus_dir, name, drops)
        with ThreadPoolExecutor(max(1, num_jobs)) as pool:
            recordings = list(pool.map(lambda u: load_recording(u, out_dir / "audio", drops), utterances))
        cuts[part] = [_cut(u, r) for u, r in zip(utterances, recordings, strict=True) if r is not None]
    counts = Counter(c.supervisions[0].speaker for c in cuts["train"])
    dev_speakers = set(choose_dev_speakers(counts, dev_utterances, dev_seed))
    by_split = {
        "train": [c for c in cuts["train"] if c.supervisions[0].speaker not in dev_speakers],
        "dev": [c for c in cuts["train"] if c.supervisions[0].speaker in dev_speakers],
        "test": cuts["test"],
    }
    result = {}
    for split, split_cuts in by_split.items():
        if not split_cuts:
            raise RecipeError(f"AN4 split {split!r} is empty ({drops.summary()}); check corpus_dir={corpus_dir}")
        result[split] = CutSet.from_cuts(split_cuts)
        write_split(out_dir, CORPUS, split, result[split])
    result["unlabeled"] = unlabeled_cuts(result["train"], language="en")
    write_unlabeled_split(out_dir, CORPUS, "unlabeled", result["unlabeled"])
    return result


@dataclass(frozen=True)
class An4Args:
    out: Path = Path("data/an4")
    corpus_dir: str = ""  # empty: <repo>/../shared/data/an4
    dev_utterances: int = DEV_UTTERANCES
    dev_seed: int = 0
    num_jobs: int = 1
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare an4 [key=value ...]

  out=PATH               output directory (default data/an4); .sph audio is stored there as FLAC (out/audio/)
  corpus_dir=PATH        AN4 copy with etc/ and wav/ (default <repo>/../shared/data/an4); .sph, .flac, .opus or .ogg
  dev_utterances=N       utterances of the held-out dev speakers (default 100)
  dev_seed=S             seed of the dev speaker choice (default 0)
  num_jobs=N             reader threads (default 1)
  on_error=fail|skip     stop at the first bad file (default) or leave bad files out, counted in the summary
"""


def dev_speakers_line(cut_sets: Mapping[str, CutSet]) -> str:
    speakers = sorted({s.speaker for c in cut_sets["dev"] for s in c.supervisions})
    return f"dev speakers (held out of train): {', '.join(speakers)}"


def run(args: An4Args) -> None:
    """``python -m usmkit.cli.prepare an4 key=value ...`` (``USAGE``)."""
    drops = RecipeDrops(args.on_error)  # type: ignore[arg-type]  (checked there)
    cut_sets = prepare_an4(
        corpus_dir=args.corpus_dir or None,
        out_dir=args.out,
        dev_utterances=args.dev_utterances,
        dev_seed=args.dev_seed,
        num_jobs=args.num_jobs,
        drops=drops,
    )
    footer = drops_footer(drops, [dev_speakers_line(cut_sets)])
    print_split_table(f"an4 manifests in {args.out}", split_rows(cut_sets), footer=footer)


ARGS = An4Args
