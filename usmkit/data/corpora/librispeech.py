"""LibriSpeech (or any directory in its layout) -> usmkit manifests, every left-out file counted.

Layout: ``{corpus_dir}/{part}/{speaker}/{chapter}/{speaker}-{chapter}-{utt}.flac`` with one
``{speaker}-{chapter}.trans.txt`` per chapter (``corpus_dir`` is the ``LibriSpeech`` folder, or its
parent). We rename the parts to usmkit split names (``dev-clean`` -> ``dev_clean``), lowercase the
transcripts (apostrophes kept), set ``language="en"`` and write
``librispeech_{recordings,supervisions,cuts}_{split}.jsonl.gz`` (paths relative to ``out``).
Nothing is downloaded.

The corpus is read here rather than through ``lhotse.recipes.prepare_librispeech``, which leaves
out utterances without audio and chapters without ``trans.txt`` without a word and stops a whole
part at one unreadable FLAC. Here every audio file is decoded to the end (``decode=false`` reads
only headers) and each problem (missing audio, a FLAC without a transcript line, a chapter without
``trans.txt``, corrupt or truncated audio, non-UTF-8 transcript lines) stops the recipe naming the
file (``on_error=fail``, the default) or is left out and counted in the printed summary
(``on_error=skip``).

CLI: ``python -m usmkit.cli.prepare librispeech corpus_dir=/data/LibriSpeech out=data/librispeech
[parts=dev-clean,test-clean] [num_jobs=2] [on_error=fail|skip] [decode=true]``
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import OnError, RecipeDrops, RecipeError, checked_recording, drops_footer, write_split
from usmkit.data.validate import read_kaldi_text
from usmkit.metrics import normalize_text

CORPUS = "librispeech"


def split_name(part: str) -> str:
    """LibriSpeech part -> usmkit split name: ``train-clean-100`` -> ``train_clean_100``."""
    return part.replace("-", "_")


def _librispeech_root(corpus_dir: Path) -> Path:
    if (corpus_dir / "LibriSpeech").is_dir():
        return corpus_dir / "LibriSpeech"
    if not corpus_dir.is_dir():
        raise FileNotFoundError(
            f"LibriSpeech directory {corpus_dir} does not exist; pass corpus_dir=DIR, the folder holding "
            "dev-clean/, train-clean-100/, ... (nothing is downloaded)"
        )
    return corpus_dir


def _is_part(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("*/*/*.trans.txt")) or any(path.glob("*/*/*.flac")))


def prepare_librispeech(
    corpus_dir: str | Path,
    out_dir: str | Path = Path("data/librispeech"),
    parts: str | Sequence[str] = "auto",
    num_jobs: int = 1,
    on_error: OnError = "fail",
    decode: bool = True,
    drops: RecipeDrops | None = None,
) -> dict[str, CutSet]:
    """Prepare every part found (``parts="auto"``) or the named ones; returns CutSets by split name.

    Left-out files are counted in ``drops`` (made from ``on_error`` when not given)."""
    root = _librispeech_root(Path(corpus_dir))
    drops = drops if drops is not None else RecipeDrops(on_error)
    if parts == "auto":
        part_dirs = [p for p in sorted(root.iterdir()) if _is_part(p)]
    else:
        part_dirs = [root / p for p in ([parts] if isinstance(parts, str) else parts)]
        absent = [p.name for p in part_dirs if not p.is_dir()]
        if absent:
            raise FileNotFoundError(
                f"LibriSpeech parts {absent} are not in {root}; parts found: "
                f"{[p.name for p in sorted(root.iterdir()) if _is_part(p)]}"
            )
    if not part_dirs:
        raise RecipeError(
            f"no LibriSpeech part found in {root}: expected part folders such as dev-clean/ or train-clean-100/ "
            "holding {speaker}/{chapter}/*.flac and *.trans.txt"
        )
    out_dir = Path(out_dir)
    result = {}
    for part_dir in part_dirs:
        split = split_name(part_dir.name)
        cuts = _part_cuts(part_dir, drops, num_jobs, decode)
        if not cuts:
            raise RecipeError(f"LibriSpeech part {part_dir} has no usable utterance ({drops.summary()})")
        cut_set = CutSet.from_cuts(cuts)
        write_split(out_dir, CORPUS, split, cut_set)
        result[split] = cut_set
    return result


def _part_cuts(part_dir: Path, drops: RecipeDrops, num_jobs: int, decode: bool) -> list[MonoCut]:
    """The cuts of one part, in (speaker, chapter, utterance) order; what cannot be used goes to ``drops``."""
    wanted: list[tuple[str, str, str, Path]] = []  # (utt id, speaker, text, flac)
    for chapter_dir in sorted(p for p in part_dir.glob("*/*") if p.is_dir()):
        flacs = {p.stem: p for p in chapter_dir.glob("*.flac")}
        speaker = chapter_dir.parent.name
        trans = chapter_dir / f"{speaker}-{chapter_dir.name}.trans.txt"
        if not trans.is_file():
            for stem in sorted(flacs):
                drops.seen()
                drops.drop("chapter without trans.txt", str(flacs[stem]), f"{trans.name} is missing in {chapter_dir}")
            continue
        texts, report = read_kaldi_text(trans, on_bad="error" if drops.on_error == "fail" else "skip")
        for problem in report.problems:
            drops.seen()
            drops.drop(problem.kind, problem.name, problem.detail)
        for utt_id, text in texts.items():
            wanted.append((utt_id, speaker, text, chapter_dir / f"{utt_id}.flac"))
        for stem in sorted(set(flacs) - set(texts)):
            drops.seen()
            drops.drop("audio without transcript", str(flacs[stem]), f"{trans.name} has no line for {stem}")

    def load(item: tuple[str, str, str, Path]) -> Recording | None:
        return checked_recording(item[3], item[0], drops, decode=decode)

    with ThreadPoolExecutor(max(1, num_jobs)) as pool:
        recordings = list(pool.map(load, wanted))
    cuts = []
    for (utt_id, speaker, text, _), recording in zip(wanted, recordings, strict=True):
        if recording is None:
            continue
        supervision = SupervisionSegment(
            id=utt_id,
            recording_id=utt_id,
            start=0.0,
            duration=recording.duration,
            channel=0,
            text=normalize_text(text),
            language="en",
            speaker=speaker,
        )
        cuts.append(MonoCut(utt_id, 0.0, recording.duration, 0, recording=recording, supervisions=[supervision]))
    return cuts


@dataclass(frozen=True)
class LibriSpeechArgs:
    corpus_dir: Path = Path("LibriSpeech")
    out: Path = Path("data/librispeech")
    parts: str = "auto"  # "auto" or comma-separated, e.g. dev-clean,test-clean
    num_jobs: int = 1
    on_error: str = "fail"  # fail | skip
    decode: bool = True


USAGE = """\
usage: python -m usmkit.cli.prepare librispeech corpus_dir=PATH [key=value ...]

  corpus_dir=PATH   the LibriSpeech folder (holding dev-clean/, ...) or its parent
  out=PATH          output directory (default data/librispeech)
  parts=auto|a,b    parts to prepare (default: every part found)
  num_jobs=N        reader threads (default 1)
  on_error=fail|skip  stop at the first bad file (default) or leave bad files out, counted in the summary
  decode=true|false decode every file to the end to find truncated ones (default true)
"""


def run(args: LibriSpeechArgs) -> None:
    """``python -m usmkit.cli.prepare librispeech key=value ...`` (``USAGE``)."""
    parts = args.parts if args.parts == "auto" else [p.strip() for p in args.parts.split(",") if p.strip()]
    drops = RecipeDrops(args.on_error)  # type: ignore[arg-type]  (checked there)
    cut_sets = prepare_librispeech(
        args.corpus_dir, args.out, parts=parts, num_jobs=args.num_jobs, decode=args.decode, drops=drops
    )
    print_split_table(f"librispeech manifests in {args.out}", split_rows(cut_sets), footer=drops_footer(drops))


ARGS = LibriSpeechArgs
