"""Where the corpus manifests live and how to load them.

Every corpus recipe writes, per split, lhotse manifests named

    {manifest_dir}/{corpus}_recordings_{split}.jsonl.gz
    {manifest_dir}/{corpus}_supervisions_{split}.jsonl.gz
    {manifest_dir}/{corpus}_cuts_{split}.jsonl.gz      <- what training and evaluation read

and a text-only pool, when the corpus has one, as ``{manifest_dir}/{corpus}_text_only.jsonl.gz``
(one ``{"text": ..., "language": ...}`` object per line).

Paths inside a manifest (audio files, stored features) under the manifest's own directory are written
relative to it by ``write_manifest`` and resolved against it when read, so a corpus directory (or a
whole clone holding it) can be moved; files elsewhere (a shared corpus) keep their absolute path. Reading also refuses recording sources that are not files: a lhotse
``command`` source would run a shell command and a ``url`` source would download, so such a cut is
rejected by id before any audio is touched (URLs only with ``allow_urls=True``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lhotse import CutSet
from lhotse.serialization import deserialize_item, load_jsonl, save_to_jsonl

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.data.validate import BadInputError, check_sources, check_timing

KINDS: tuple[str, ...] = ("recordings", "supervisions", "cuts")
_SUFFIX = ".jsonl.gz"

_HOW_TO_BUILD = (
    "build the embedded corpus with `python -m usmkit.cli.prepare synth out=DIR`, or prepare a real corpus with "
    "`python -m usmkit.cli.prepare fsdd out=DIR` / `python -m usmkit.cli.prepare librispeech corpus_dir=... out=DIR`"
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


def load_cuts(
    manifest_dir: str | os.PathLike[str],
    split: str,
    corpus: str = "synth",
    lazy: bool = False,
    allow_urls: bool = False,
) -> CutSet:
    """The CutSet of one split, paths resolved against ``manifest_dir``, only file sources (see the module
    docstring). ``lazy=True`` streams it from disk (for corpora that do not fit in memory)."""
    path = manifest_path(manifest_dir, corpus, "cuts", split)
    if not path.is_file():
        found = available_splits(manifest_dir, corpus)
        raise FileNotFoundError(
            f"no cuts manifest for corpus {corpus!r}, split {split!r}: {path} does not exist "
            f"(splits found in {manifest_dir}: {found or 'none'}); {_HOW_TO_BUILD}"
        )
    return read_cuts(path, lazy=lazy, allow_urls=allow_urls)


def read_cuts(path: str | os.PathLike[str], lazy: bool = False, allow_urls: bool = False) -> CutSet:
    """A cuts manifest file, resolved and checked like ``load_cuts``."""
    path = Path(path)
    base = path.parent.resolve()
    if lazy:
        return CutSet.from_jsonl_lazy(path).map(
            functools.partial(_resolve_cut, base=base, allow_urls=allow_urls, path=path)
        )
    return CutSet.from_cuts([_resolve_dict(d, base, allow_urls, path) for d in read_dicts(path)])


def write_manifest(manifest: Iterable[Any], path: str | os.PathLike[str]) -> Path:
    """Write a lhotse manifest (RecordingSet, SupervisionSet, CutSet) as JSONL with every file path
    relative to ``path``'s directory, never half-written (``write_jsonl``)."""
    path = Path(path)
    base = path.parent.resolve()
    return write_jsonl((_map_paths(item.to_dict(), functools.partial(_relative, base=base)) for item in manifest), path)


def write_jsonl(records: Iterable[dict], path: str | os.PathLike[str]) -> Path:
    """Write JSON lines (gzipped for a ``.gz`` path), never half-written (``replaced_atomically``: two
    processes writing one file at once, e.g. parallel runs filling one feature cache, each rename a
    whole file, never each other's half)."""
    with replaced_atomically(path) as tmp:
        save_to_jsonl(records, tmp)
    return Path(path)


def read_dicts(path: Path) -> Iterator[dict]:
    """The JSON lines of ``path`` (a manifest or a text-only file); unreadable ones are a ``BadInputError``
    naming the file."""
    try:
        yield from load_jsonl(path)
    except UnicodeDecodeError as e:
        raise BadInputError(
            "unreadable manifest",
            str(path),
            f"byte 0x{e.object[e.start]:02x} at offset {e.start} (of the decompressed text) is not valid UTF-8",
            hint="rebuild the manifest with the recipe that made it (manifests are UTF-8 JSON lines)",
        ) from None
    except (ValueError, EOFError, OSError) as e:  # bad JSON, truncated gzip
        raise BadInputError(
            "unreadable manifest", str(path), f"{type(e).__name__}: {e}", hint="rebuild it with the recipe that made it"
        ) from None


def _resolve_cut(cut: Any, base: Path, allow_urls: bool, path: Path) -> Any:
    return _resolve_dict(cut.to_dict(), base, allow_urls, path)


def _resolve_dict(data: dict, base: Path, allow_urls: bool, path: Path) -> Any:
    """One manifest entry: sources and timing checked (before anything is built from it), paths resolved,
    deserialized."""
    check_sources(data, str(data.get("id")), allow_urls=allow_urls, where=str(path))
    check_timing(data, str(data.get("id")), where=str(path))
    return deserialize_item(_map_paths(data, functools.partial(_absolute, base=base)))


def _map_paths(data: Any, fn: Any) -> Any:
    """``data`` with ``fn`` applied to every file path: file sources of recordings, features' storage paths."""
    if isinstance(data, list):
        return [_map_paths(v, fn) for v in data]
    if not isinstance(data, dict):
        return data
    out = {k: _map_paths(v, fn) for k, v in data.items()}
    if out.get("type") == "file" and isinstance(out.get("source"), str) and "channels" in out:
        out["source"] = fn(out["source"])
    if isinstance(out.get("storage_path"), str) and out["storage_path"] and "storage_type" in out:
        out["storage_path"] = fn(out["storage_path"])
    return out


def _relative(p: str, base: Path) -> str:
    """Relative to ``base`` when inside it (the corpus moves with its manifests); absolute otherwise (a
    corpus elsewhere, e.g. a shared data folder, stays where it is when the manifests move)."""
    absolute = os.path.abspath(p)
    relative = os.path.relpath(absolute, base)
    return absolute if relative == ".." or relative.startswith(".." + os.sep) else relative


def _absolute(p: str, base: Path) -> str:
    return p if os.path.isabs(p) else os.path.normpath(base / p)


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
