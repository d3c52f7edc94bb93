"""LibriSpeech (or any directory in its layout) -> usmkit manifests, through lhotse's own recipe.

Layout: ``{corpus_dir}/{part}/{speaker}/{chapter}/{speaker}-{chapter}-{utt}.flac`` with one
``{speaker}-{chapter}.trans.txt`` per chapter (``corpus_dir`` is the ``LibriSpeech`` folder, or its
parent). ``lhotse.recipes.prepare_librispeech`` reads it; we rename the parts to usmkit split
names (``dev-clean`` -> ``dev_clean``), lowercase the transcripts (apostrophes kept), set
``language="en"`` and write ``librispeech_{recordings,supervisions,cuts}_{split}.jsonl.gz``.
Nothing is downloaded.

CLI: ``python -m usmkit.data.recipes.librispeech corpus_dir=/data/LibriSpeech out=data/librispeech
[parts=dev-clean,test-clean] [num_jobs=2]``
"""

from __future__ import annotations

import usmkit.entrypoint  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from lhotse import CutSet, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.recipes import prepare_librispeech as lhotse_prepare_librispeech

from usmkit.data.manifests import manifest_path
from usmkit.data.recipes import normalize_text, parse_key_value_args, print_split_table, split_rows

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


def prepare_librispeech(
    corpus_dir: str | Path,
    out_dir: str | Path = Path("data/librispeech"),
    parts: str | Sequence[str] = "auto",
    num_jobs: int = 1,
) -> dict[str, CutSet]:
    """Prepare every part found (``parts="auto"``) or the named ones; returns CutSets by split name."""
    root = _librispeech_root(Path(corpus_dir))
    try:
        manifests = lhotse_prepare_librispeech(root, dataset_parts=parts, output_dir=None, num_jobs=num_jobs)
    except ValueError as err:  # lhotse: "Could not find any of librispeech or mini_librispeech splits in ..."
        raise ValueError(f"{err}; expected part folders such as dev-clean/ or train-clean-100/ in {root}") from err
    if not manifests:
        raise ValueError(f"no LibriSpeech part with transcripts found in {root} (parts={parts!r})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for part, sets in sorted(manifests.items()):
        split = split_name(part)
        recordings: RecordingSet = sets["recordings"]
        supervisions = SupervisionSet.from_segments(_english(s) for s in sets["supervisions"])
        cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
        recordings.to_file(manifest_path(out_dir, CORPUS, "recordings", split))
        supervisions.to_file(manifest_path(out_dir, CORPUS, "supervisions", split))
        cuts.to_file(manifest_path(out_dir, CORPUS, "cuts", split))
        result[split] = cuts
    return result


def _english(segment: SupervisionSegment) -> SupervisionSegment:
    """Lowercase transcript (apostrophes kept: "don't"), ISO language code."""
    return replace(segment, text=normalize_text(segment.text or "", keep_apostrophes=True), language="en")


@dataclass(frozen=True)
class LibriSpeechArgs:
    corpus_dir: Path = Path("LibriSpeech")
    out: Path = Path("data/librispeech")
    parts: str = "auto"  # "auto" or comma-separated, e.g. dev-clean,test-clean
    num_jobs: int = 1


USAGE = """\
usage: python -m usmkit.data.recipes.librispeech corpus_dir=PATH [key=value ...]

  corpus_dir=PATH   the LibriSpeech folder (holding dev-clean/, ...) or its parent
  out=PATH          output directory (default data/librispeech)
  parts=auto|a,b    parts to prepare (default: every part found)
  num_jobs=N        reader threads (default 1)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_key_value_args(LibriSpeechArgs, sys.argv[1:] if argv is None else argv, USAGE)
    parts = args.parts if args.parts == "auto" else [p.strip() for p in args.parts.split(",") if p.strip()]
    cut_sets = prepare_librispeech(args.corpus_dir, args.out, parts=parts, num_jobs=args.num_jobs)
    print_split_table(f"librispeech manifests in {args.out}", split_rows(cut_sets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
