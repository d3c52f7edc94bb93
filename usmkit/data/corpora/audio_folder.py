"""A folder of audio files without transcripts -> one audio-only split (an unlabeled pool for BEST-RQ).

CLI::

    python -m usmkit.cli.prepare audio_folder corpus_dir=../shared/data/librispeech_clips \\
        out=data/librispeech_clips corpus=librispeech_clips [split=unlabeled] [language=en] \\
        [extensions=[.wav,.flac,.ogg,.opus,.mp3]] [min_duration=0.5] [on_error=fail|skip]

Every file under ``corpus_dir`` (any depth) whose name ends in one of ``extensions`` becomes one cut, its id
the file's path below ``corpus_dir`` with ``/`` as ``-`` and no extension (``test-other/1688/1688-142285-0000``
-> ``test-other-1688-1688-142285-0000``), its language ``language`` in ``cut.custom`` (as ``prepare pool``
keeps it). Every file is decoded once: an empty, corrupt, cut-short or non-finite one stops the recipe naming
it (``on_error=fail``) or is left out and counted (``on_error=skip``); files shorter than ``min_duration``
seconds are left out and counted whatever ``on_error`` says. Audio at another rate loads resampled to 16 kHz. Writes
``{out}/{corpus}_{recordings,cuts}_{split}.jsonl.gz``; ``data.train_split={split}`` trains on it, and
``prepare pool`` joins it to other corpora's audio.

lhotse's ``RecordingSet.from_dir`` lists a folder too, but it neither decodes the files nor says which it left
out, so a truncated file would only fail in the middle of training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lhotse import CutSet, MonoCut

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import (
    RecipeDrops,
    RecipeError,
    checked_recording,
    drops_footer,
    write_unlabeled_split,
)

USAGE = __doc__
SAMPLE_RATE = 16000


@dataclass
class AudioFolderArgs:
    corpus_dir: str = ""
    out: str = "data/audio_folder"
    corpus: str = "audio_folder"
    split: str = "unlabeled"
    language: str = "en"
    extensions: list[str] = field(default_factory=lambda: [".wav", ".flac", ".ogg", ".opus", ".mp3"])
    min_duration: float = 0.5
    on_error: str = "fail"  # fail | skip


def audio_files(corpus_dir: Path, extensions: list[str]) -> list[Path]:
    """Every file under ``corpus_dir`` whose name ends in one of ``extensions`` (case-insensitive), sorted."""
    if not corpus_dir.is_dir():
        raise RecipeError(f"corpus_dir={corpus_dir} is not a folder; pass corpus_dir=DIR, the folder of audio files")
    suffixes = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)
    files = sorted(p for p in corpus_dir.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes))
    if not files:
        raise RecipeError(
            f"no audio files ({', '.join(suffixes)}) under {corpus_dir}; pass extensions=[...] to name yours"
        )
    return files


def cut_id(corpus_dir: Path, path: Path) -> str:
    """The file's path below ``corpus_dir`` without its extension, ``/`` as ``-``."""
    return "-".join(path.relative_to(corpus_dir).with_suffix("").parts)


def folder_cuts(args: AudioFolderArgs, drops: RecipeDrops) -> tuple[CutSet, list[Path]]:
    """The cuts of every usable file, and the files left out as shorter than ``min_duration``."""
    corpus_dir = Path(args.corpus_dir)
    cuts, ids, short = [], {}, []
    for path in audio_files(corpus_dir, args.extensions):
        cid = cut_id(corpus_dir, path)
        if cid in ids:  # a.wav and a.flac side by side
            raise RecipeError(f"{path} and {ids[cid]} would both be cut {cid!r}: keep one of them in {corpus_dir}")
        ids[cid] = path
        recording = checked_recording(path, cid, drops)
        if recording is None:
            continue
        if recording.duration < args.min_duration:
            short.append(path)
            continue
        if recording.sampling_rate != SAMPLE_RATE:
            recording = recording.resample(SAMPLE_RATE)
        custom = {"speaker": None, "language": args.language}
        cuts.append(MonoCut(cid, 0.0, recording.duration, 0, recording=recording, custom=custom))
    if not cuts:
        raise RecipeError(
            f"no usable audio under {corpus_dir}: {drops.summary()}; {len(short)} files shorter than "
            f"min_duration={args.min_duration} s"
        )
    return CutSet.from_cuts(cuts), short


def run(args: AudioFolderArgs) -> None:
    """``python -m usmkit.cli.prepare audio_folder key=value ...`` (``USAGE``)."""
    if not args.corpus_dir:
        raise RecipeError("audio_folder needs corpus_dir=DIR, the folder of audio files")
    src, out = Path(args.corpus_dir).resolve(), Path(args.out).resolve()
    if out == src or src in out.parents:
        raise RecipeError(f"out={args.out} is inside corpus_dir={args.corpus_dir}: pass a folder outside the audio's")
    drops = RecipeDrops(on_error=args.on_error)
    cuts, short = folder_cuts(args, drops)
    write_unlabeled_split(args.out, args.corpus, args.split, cuts)
    print_split_table(f"{args.corpus} in {args.out}", split_rows({args.split: cuts}))
    extra = [f"{len(short)} shorter than min_duration={args.min_duration} s left out"] if short else []
    print(drops_footer(drops, extra))


ARGS = AudioFolderArgs
