"""The one guard of every command that writes a whole folder (``--out`` of ``usmkit-average``, ``out=`` of
``usmkit.cli.export`` and of the ``usmkit.cli.prepare`` recipes, ``trainer.exp_dir`` of training): it refuses
an existing folder that holds work of another kind, so a slip such as ``usmkit-average exp/run --out exp/run``
cannot replace an experiment, nor a run started with ``trainer.exp_dir`` set to a checkpoint write its
config over the checkpoint's. ``check_output_file`` is its counterpart for the JSON result files
(``output=`` of evaluate and tune_lexicon, ``--json`` of usmkit-transcribe): they replace only their own
earlier result, never a checkpoint's file or a recording named by a slip.

What a folder holds is told from the names usmkit gives its files, without reading them all:

    experiment directory   checkpoints/, metrics.jsonl, run.lock (.run.flock), config.yaml or train.log
    checkpoints folder     step-N/ folders
    checkpoint             model.safetensors (or train_state.json)
    corpus folder          corpus.json or lhotse manifests ``{corpus}_{cuts,recordings,supervisions}_{split}.jsonl[.gz]``
    export                 export.json

>>> check_output_dir(Path("exp/run"), option="--out", own_kind="checkpoint", own_words="an averaged checkpoint",
...                  own=is_average)  # doctest: +SKIP
UsageError: --out exp/run is an experiment directory (it has checkpoints/), not an averaged checkpoint; ...
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from usmkit.errors import UsageError

_MANIFEST = re.compile(r"^(?P<corpus>.+?)_(?:cuts|recordings|supervisions)_.+\.jsonl(?:\.gz)?$")
_TEXT_ONLY = re.compile(r"^(?P<corpus>.+?)_text_only\.jsonl(?:\.gz)?$")
_STEP_DIR = re.compile(r"^step-\d+$")
CORPUS_SUMMARY = "corpus.json"  # usmkit.data.synth.build writes it last


def corpus_names(folder: Path) -> set[str]:
    """The corpus names of the lhotse manifests (and ``corpus.json``) directly in ``folder``."""
    names = set()
    for p in folder.iterdir():
        m = _MANIFEST.match(p.name) or _TEXT_ONLY.match(p.name)
        if m and p.is_file():
            names.add(m.group("corpus"))
    summary = folder / CORPUS_SUMMARY
    if summary.is_file():
        try:
            name = json.loads(summary.read_text(encoding="utf-8")).get("corpus")
        except (OSError, ValueError, AttributeError):
            name = None
        names.add(name if isinstance(name, str) else "?")
    return names


def folder_kind(folder: Path) -> tuple[str, str] | None:
    """What usmkit work ``folder`` holds: (kind, words for a message), kind one of ``checkpoint``,
    ``experiment``, ``checkpoints``, ``corpus``, ``export``; None for a folder holding none of it."""
    has = lambda name: (folder / name).exists()  # noqa: E731
    for name in ("model.safetensors", "train_state.json"):
        if has(name):
            return "checkpoint", f"a checkpoint (it has {name})"
    for name in ("checkpoints", "metrics.jsonl", "run.lock", ".run.flock", "config.yaml", "train.log"):
        if has(name):
            return "experiment", f"an experiment directory (it has {name}{'/' if (folder / name).is_dir() else ''})"
    steps = sorted(p.name for p in folder.iterdir() if _STEP_DIR.match(p.name) and p.is_dir())
    if steps:
        return "checkpoints", f"a run's checkpoints folder (it has {steps[-1]}/)"
    corpora = corpus_names(folder)
    if corpora:
        return (
            "corpus",
            f"the corpus folder of {', '.join(sorted(corpora))} (it has lhotse manifests or {CORPUS_SUMMARY})",
        )
    if has("export.json"):
        return "export", "an export (it has export.json)"
    return None


def check_writable(path: Path, shown: str) -> None:
    """``UsageError`` where ``path`` (a folder or file to create or replace, given as ``shown``) cannot be
    written: a folder above it is a file, or the folder it would be written in is read-only (permissions, a
    read-only mount). Called before any work, so the slip costs nothing."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if existing != path and not existing.is_dir():
        raise UsageError(f"{shown}: {existing} is a file, so nothing can be written under it; pass another path")
    folder = existing if existing.is_dir() else existing.parent  # (a file is replaced from its folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{shown}: {folder} is read-only here (cannot be written); pass a path that can be")


def check_output_dir(
    out: Path, *, option: str, own_kind: str, own_words: str, own: Callable[[Path], bool], replaces: bool = True
) -> None:
    """Refuse to write the output folder ``out`` (given as ``option``, e.g. ``--out`` or ``out=``) where it
    exists and holds usmkit work (``folder_kind``: an experiment directory, a checkpoint, a corpus folder,
    an export) other than this command's own earlier output (``own_words``, e.g. "an export directory"):
    of kind ``own_kind`` and ``own(out)``. ``replaces``: the command replaces the folder whole, so any
    other non-empty folder is refused too.

    Raises ``UsageError`` naming the folder, what it holds and what to do."""
    out = Path(out)
    shown = f"{option}{out}" if option.endswith("=") else f"{option} {out}"
    if out.exists() and not out.is_dir():
        raise UsageError(f"{shown} exists and is not a folder; pass a new folder")
    check_writable(out, shown)
    if not out.exists():
        return
    found = folder_kind(out)
    if found is None:
        if replaces and any(out.iterdir()):
            raise UsageError(
                f"{shown} exists and is not {own_words}: the files in it would be replaced; pass a new folder"
            )
        return
    kind, words = found
    if kind == own_kind and own(out):
        return
    raise UsageError(
        f"{shown} is {words}, not {own_words}; writing there would replace or mix into it: pass a new folder"
    )


def check_experiment_dir(exp_dir: Path) -> None:
    """Refuse ``trainer.exp_dir`` where it is a file, or a folder holding usmkit work other than an experiment
    (a checkpoint, a run's checkpoints folder, a corpus folder, an export): a run writes its config,
    tokenizer, statistics, logs and checkpoints into it, over what is there. An experiment directory (a
    run to resume, or one whose earlier run the run itself refuses) and a new or foreign folder pass."""
    exp_dir = Path(exp_dir)
    if exp_dir.exists() and not exp_dir.is_dir():
        raise UsageError(f"trainer.exp_dir={exp_dir} exists and is not a folder; choose another trainer.exp_dir")
    check_writable(exp_dir, f"trainer.exp_dir={exp_dir}")
    if not exp_dir.exists():
        return
    found = folder_kind(exp_dir)
    if found is None or found[0] == "experiment":
        return
    raise UsageError(
        f"trainer.exp_dir={exp_dir} is {found[1]}, not an experiment directory: a run would write its config, "
        "tokenizer, logs and checkpoints into it; choose another trainer.exp_dir"
    )


def check_output_file(out: Path, *, option: str, own_words: str, own_keys: tuple[str, ...]) -> None:
    """Refuse to write the JSON result file ``out`` (given as ``option``, e.g. ``output=`` or ``--json``)
    where it is a folder, or an existing non-empty file other than this command's own earlier result: a JSON
    object holding ``own_keys`` (``own_words`` names it in the message). Called before any work, so a slip such as
    ``output=exp/run/checkpoints/step-000100/model.safetensors`` costs nothing and replaces nothing."""
    out = Path(out)
    shown = f"{option}{out}" if option.endswith("=") else f"{option} {out}"
    if out.is_dir():
        raise UsageError(f"{shown} is a folder; pass a file name, e.g. {out / 'result.json'}")
    check_writable(out, shown)
    if not out.exists() or out.stat().st_size == 0 or _is_json_object_with(out, own_keys):
        return  # nothing there, nothing in it, or an earlier result of this command
    raise UsageError(
        f"{shown} exists and is not {own_words} (a JSON object with {', '.join(own_keys)}): writing there would "
        "replace it; pass a new file name, or remove that file first if it is yours to lose"
    )


def _is_json_object_with(path: Path, keys: tuple[str, ...]) -> bool:
    try:
        with path.open("rb") as f:
            if f.read(64).lstrip()[:1] != b"{":  # not JSON: weights, audio, YAML; nothing more is read
                return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in keys)
