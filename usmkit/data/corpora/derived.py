"""A split made from another split of a corpus folder (``bandlimit``, ``subset``): which corpus it is written
under and where, checked before anything is read."""

from __future__ import annotations

from pathlib import Path

from usmkit.checkpointing.output_dir import corpus_names
from usmkit.data.corpora.common import RecipeError
from usmkit.data.manifests import available_splits


def source_corpus(args, recipe: str) -> str:
    """The corpus name the new split is written under: ``args.corpus``, else the only one in ``args.src``
    (``usmkit.cli.prepare`` checks that ``out`` holds this corpus or nothing)."""
    if args.corpus:
        return args.corpus
    if not args.src or not Path(args.src).is_dir():
        raise RecipeError(f"{recipe} needs src=DIR, a usmkit corpus folder (got src={args.src!r})")
    names = corpus_names(Path(args.src))
    if len(names) != 1:
        found = ", ".join(sorted(names)) or "none"
        raise RecipeError(f"src={args.src} holds the manifests of {found}: name the one to use with corpus=NAME")
    return next(iter(names))


def derived_split_out(args, corpus: str, name: str) -> Path:
    """Where a split made from ``args.split`` of ``args.src`` goes (``args.out``, default ``src``), once the
    source split exists and the new ``name`` would not replace it."""
    if args.split not in available_splits(args.src, corpus):
        found = ", ".join(available_splits(args.src, corpus)) or "none"
        raise RecipeError(f"src={args.src} has no split {args.split!r} of corpus {corpus} (splits: {found})")
    out = Path(args.out or args.src)
    if name == args.split and out.resolve() == Path(args.src).resolve():
        raise RecipeError(f"name={name} would replace the split it is made from: pass another name= or out=")
    return out
