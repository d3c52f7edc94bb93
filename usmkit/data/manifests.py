"""Where the corpus manifests live and how to load them.

Every corpus recipe writes, per split, lhotse manifests named

    {manifest_dir}/{corpus}_recordings_{split}.jsonl.gz
    {manifest_dir}/{corpus}_supervisions_{split}.jsonl.gz
    {manifest_dir}/{corpus}_cuts_{split}.jsonl.gz      <- what training and evaluation read

and a text-only pool, when the corpus has one, as ``{manifest_dir}/{corpus}_text_only.jsonl.gz``
(one ``{"text": ..., "language": ...}`` object per line).
"""

from __future__ import annotations

import os
from pathlib import Path

from lhotse import CutSet
from lhotse.serialization import load_jsonl

KINDS: tuple[str, ...] = ("recordings", "supervisions", "cuts")
_SUFFIX = ".jsonl.gz"

_HOW_TO_BUILD = (
    "build the embedded corpus with `python -m usmkit.data.synth out=DIR`, or prepare a real corpus with "
    "`python -m usmkit.data.recipes.fsdd out=DIR` / `python -m usmkit.data.recipes.librispeech corpus_dir=... out=DIR`"
)


def manifest_path(manifest_dir: str | os.PathLike[str], corpus: str, kind: str, split: str) -> Path:
    """``{manifest_dir}/{corpus}_{kind}_{split}.jsonl.gz``; ``kind`` is recordings, supervisions or cuts."""
    if kind not in KINDS:
        raise ValueError(f"manifest kind must be one of {KINDS}, got {kind!r}")
    for name, value in (("corpus", corpus), ("split", split)):
        if not value or "/" in value or os.sep in value:
            raise ValueError(f"{name} must be a plain name without path separators, got {value!r}")
    return Path(manifest_dir) / f"{corpus}_{kind}_{split}{_SUFFIX}"


def text_only_path(manifest_dir: str | os.PathLike[str], corpus: str = "synth") -> Path:
    return Path(manifest_dir) / f"{corpus}_text_only{_SUFFIX}"


def available_splits(manifest_dir: str | os.PathLike[str], corpus: str = "synth") -> list[str]:
    """Splits that have a cuts manifest, sorted (e.g. ``['dev', 'test', 'test_other', 'train', ...]``)."""
    prefix = f"{corpus}_cuts_"
    directory = Path(manifest_dir)
    if not directory.is_dir():
        return []
    return sorted(
        p.name[len(prefix) : -len(_SUFFIX)]
        for p in directory.glob(f"{prefix}*{_SUFFIX}")
        if p.name.startswith(prefix) and p.name.endswith(_SUFFIX)
    )


def load_cuts(manifest_dir: str | os.PathLike[str], split: str, corpus: str = "synth", lazy: bool = False) -> CutSet:
    """The CutSet of one split. ``lazy=True`` streams it from disk (for corpora that do not fit in memory)."""
    path = manifest_path(manifest_dir, corpus, "cuts", split)
    if not path.is_file():
        found = available_splits(manifest_dir, corpus)
        raise FileNotFoundError(
            f"no cuts manifest for corpus {corpus!r}, split {split!r}: {path} does not exist "
            f"(splits found in {manifest_dir}: {found or 'none'}); {_HOW_TO_BUILD}"
        )
    return CutSet.from_jsonl_lazy(path) if lazy else CutSet.from_file(path)


def load_text_only(manifest_dir: str | os.PathLike[str], corpus: str = "synth") -> list[dict]:
    """The text-only pool: a list of ``{"text": str, "language": str}``."""
    path = text_only_path(manifest_dir, corpus)
    if not path.is_file():
        raise FileNotFoundError(f"no text-only pool for corpus {corpus!r}: {path} does not exist; {_HOW_TO_BUILD}")
    records = list(load_jsonl(path))
    for line, record in enumerate(records, start=1):
        if not isinstance(record, dict) or "text" not in record or "language" not in record:
            raise ValueError(f"{path}, line {line}: expected an object with 'text' and 'language', got {record!r}")
    return records
