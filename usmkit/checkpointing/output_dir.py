"""The one guard of every command that writes: ``check_output`` refuses, before anything is written, an
output path that

- is, contains or lies inside one of the command's inputs (``src=`` of a Shar conversion, ``inputs=`` of
  batch transcription and pseudo-labelling, the checkpoint it reads);
- lies inside usmkit work the command does not own: a checkpoint, a run's checkpoints folder, an experiment
  directory, a corpus folder, a Shar folder or an export (``ctm=exp/run/checkpoints/step-1/model.safetensors``,
  ``srt_dir=data/an4/srt``); a command may write inside the work it reads (``home``: evaluate's result in its
  checkpoint);
- exists and is not the command's own earlier output: a folder holding other work or, for a command that
  replaces its folder's contents, any other non-empty folder; a file that is not its own kind of file.

Every writing command goes through it: ``--out`` of ``usmkit-average``, ``out=`` of ``usmkit.cli.export``,
of the ``usmkit.cli.prepare`` recipes and of their Shar conversion, ``trainer.exp_dir`` of training
(``check_experiment_dir``), ``out=``, ``ctm=`` and ``srt_dir=`` of batch transcription, ``out=`` of
pseudo-labelling, and the JSON result files (``output=`` of evaluate and tune_lexicon, ``--json`` of
usmkit-transcribe: ``check_output_file``).

What a folder holds is told from the names usmkit gives its files, without reading them all:

    experiment directory   checkpoints/, metrics.jsonl, run.lock (.run.flock), config.yaml or train.log
    checkpoints folder     step-N/ folders
    checkpoint             model.safetensors (or train_state.json)
    corpus folder          corpus.json or lhotse manifests ``{corpus}_{cuts,recordings,supervisions}_{split}.jsonl[.gz]``
    Shar folder            shar.json
    export                 export.json

(Above an output, config.yaml and train.log alone do not make a folder an experiment: those names are common.)

>>> check_output_dir(Path("exp/run"), option="--out", own_kind="checkpoint", own_words="an averaged checkpoint",
...                  own=is_average)  # doctest: +SKIP
UsageError: --out exp/run is an experiment directory (it has checkpoints/), not an averaged checkpoint; ...
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from usmkit.errors import UsageError

_MANIFEST = re.compile(r"^(?P<corpus>.+?)_(?:cuts|recordings|supervisions)_.+\.jsonl(?:\.gz)?$")
_TEXT_ONLY = re.compile(r"^(?P<corpus>.+?)_text_only\.jsonl(?:\.gz)?$")
_STEP_DIR = re.compile(r"^step-\d+$")
CORPUS_SUMMARY = "corpus.json"  # usmkit.data.synth.build writes it last
SHAR_INDEX = "shar.json"  # usmkit.data.shar writes it last
_EXPERIMENT_FILES = ("checkpoints", "metrics.jsonl", "run.lock", ".run.flock", "config.yaml", "train.log")
_RUN_WRITES = "a run would write its config, tokenizer, logs and checkpoints into it"
_COMMON_NAMES = ("config.yaml", "train.log")  # names other tools use too: an experiment's only for its own folder
# What a run writes beside its checkpoints (usmkit.training.recipe, above this layer): a folder of these names
# alone is a run's, e.g. one that stopped before its first checkpoint.
_RUN_FILES = frozenset({*_EXPERIMENT_FILES, "tokenizer.model", "feature_stats.safetensors", "tensorboard"})


def corpus_names(folder: Path, entries: list[Path] | None = None) -> set[str]:
    """The corpus names of the lhotse manifests (and ``corpus.json``) directly in ``folder`` (``entries``: its
    listing, where the caller has it)."""
    names = set()
    for p in folder.iterdir() if entries is None else entries:
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


def folder_kind(folder: Path, *, above: bool = False) -> tuple[str, str] | None:
    """What usmkit work ``folder`` holds: (kind, words for a message), kind one of ``checkpoint``,
    ``experiment``, ``checkpoints``, ``corpus``, ``shar``, ``export``; None for a folder holding none of it.
    ``above``: ``folder`` lies above an output, where config.yaml or train.log alone say nothing."""
    has = lambda name: (folder / name).exists()  # noqa: E731
    try:
        entries = list(folder.iterdir())
    except OSError:  # not a folder, or one that cannot be listed: nothing of ours can be told
        return None
    for name in ("model.safetensors", "train_state.json"):
        if has(name):
            return "checkpoint", f"a checkpoint (it has {name})"
    for name in _EXPERIMENT_FILES:
        if has(name) and not (above and name in _COMMON_NAMES):
            return "experiment", f"an experiment directory (it has {name}{'/' if (folder / name).is_dir() else ''})"
    steps = sorted(p.name for p in entries if _STEP_DIR.match(p.name) and p.is_dir())
    if steps:
        return "checkpoints", f"a run's checkpoints folder (it has {steps[-1]}/)"
    corpora = corpus_names(folder, entries)
    if corpora:
        return (
            "corpus",
            f"the corpus folder of {', '.join(sorted(corpora))} (it has lhotse manifests or {CORPUS_SUMMARY})",
        )
    if has(SHAR_INDEX):
        return "shar", f"a Shar folder (it has {SHAR_INDEX})"
    if has("export.json"):
        return "export", "an export (it has export.json)"
    if entries and not above and all(p.name in _RUN_FILES for p in entries):
        return "experiment", f"an experiment directory (it has {sorted(p.name for p in entries)[0]})"
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


def _shown(option: str, path: Path) -> str:
    return f"{option}{path}" if option.endswith("=") else f"{option} {path}"


def check_apart(out: Path, shown: str, inputs: Iterable[tuple[str, Path]], *, folder: bool) -> None:
    """``UsageError`` where the output ``out`` (given as ``shown``) is one of ``inputs`` ((words, path), e.g.
    ``("src=data/an4", Path("data/an4"))``: what the command reads, or its other outputs), lies inside one,
    or (an output ``folder``) contains one."""
    o = Path(out).resolve()
    for words, path in inputs:
        i = Path(path).resolve()
        if o == i:
            raise UsageError(f"{shown} is also {words}: it would be replaced; pass another path")
        if i in o.parents:
            raise UsageError(
                f"{shown} lies inside {words}: outputs are kept apart from what a command reads and writes; pass a "
                "path outside it"
            )
        if folder and o in i.parents:
            raise UsageError(f"{shown} contains {words}: it could be replaced; pass a path outside it")


def check_not_inside_work(
    out: Path, shown: str, home: Iterable[Path] = (), *, todo: str = "pass a path outside it"
) -> None:
    """``UsageError`` where ``out`` lies inside a folder of usmkit work (``folder_kind``) other than ``home``:
    the work the command reads and may write beside (a folder above, below or at a ``home`` path)."""
    homes = [Path(h).resolve() for h in home]
    for above in Path(out).resolve().parents:
        found = folder_kind(above, above=True)
        if found is None:
            continue
        if any(above == h or above in h.parents or h in above.parents for h in homes):
            continue
        raise UsageError(
            f"{shown} lies inside {found[1].replace('(it has', f'{above} (it has', 1)}: writing there would mix into "
            f"work this command does not own; {todo}"
        )


def check_output(
    out: Path,
    *,
    option: str,
    own_words: str,
    own: Callable[[Path], bool],
    folder: bool,
    own_kind: str | None = None,
    replaces: bool = True,
    inputs: Iterable[tuple[str, Path]] = (),
    home: Iterable[Path] = (),
) -> None:
    """The guard of the module docstring for the output ``out`` of a command (given as ``option``, e.g.
    ``ctm=`` or ``--out``): a ``folder`` or a file. ``own(out)`` says whether what is there is this
    command's own earlier output (``own_words`` names it in messages); for a folder holding usmkit work
    (``folder_kind``) it must also be of kind ``own_kind``. ``replaces``: the command replaces or adds to
    the folder's files, so any other non-empty folder is refused too. ``inputs``: (words, path) of what
    the command reads (``check_apart``); ``home``: work it may write inside (``check_not_inside_work``).

    Raises ``UsageError`` naming the path, what it is and what to do."""
    out = Path(out)
    shown = _shown(option, out)
    if folder and out.exists() and not out.is_dir():
        raise UsageError(f"{shown} exists and is not a folder; pass a new folder")
    if not folder and out.is_dir():
        raise UsageError(f"{shown} is a folder; pass a file name, e.g. {out / 'result'}")
    check_writable(out, shown)
    found = folder_kind(out) if folder and out.exists() else None
    if found is not None and not (found[0] == own_kind and own(out)):  # what it is says most: said first
        raise UsageError(
            f"{shown} is {found[1]}, not {own_words}; writing there would replace or mix into it: pass a new folder"
        )
    check_apart(out, shown, inputs, folder=folder)
    check_not_inside_work(out, shown, home)
    if not out.exists() or found is not None:
        return
    if not folder:
        if out.stat().st_size == 0 or own(out):
            return  # nothing in it, or an earlier output of this command
        raise UsageError(
            f"{shown} exists and is not {own_words}: writing there would replace it; pass a new file name, or "
            "remove that file first if it is yours to lose"
        )
    if replaces and any(out.iterdir()) and not own(out):
        raise UsageError(f"{shown} exists and is not {own_words}: the files in it would be replaced; pass a new folder")


def check_output_dir(
    out: Path,
    *,
    option: str,
    own_kind: str,
    own_words: str,
    own: Callable[[Path], bool],
    replaces: bool = True,
    inputs: Iterable[tuple[str, Path]] = (),
    home: Iterable[Path] = (),
) -> None:
    """``check_output`` of a folder that a command replaces whole or adds to (``--out`` of usmkit-average,
    ``out=`` of export, prepare and pseudo-labelling)."""
    check_output(
        out, option=option, own_words=own_words, own=own, folder=True, own_kind=own_kind, replaces=replaces,
        inputs=inputs, home=home,
    )  # fmt: skip


def is_experiment(folder: Path) -> bool:
    """Whether ``folder``'s config.yaml and metrics.jsonl, where it has them, are a training run's: a YAML
    mapping with ``trainer`` and ``model``, and JSON lines with a ``step`` (its first line is read). A
    config.yaml that is a link is not judged: the run replaces the link, never writes through it."""
    config, metrics = folder / "config.yaml", folder / "metrics.jsonl"
    if config.exists() and not config.is_symlink():
        try:
            data = yaml.safe_load(config.read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            return False
        if not (isinstance(data, dict) and "trainer" in data and "model" in data):
            return False
    if metrics.exists():
        try:
            with metrics.open("rb") as f:
                first = f.readline()
            entry = json.loads(first) if first.strip() else {"step": 0}
        except (OSError, ValueError):
            return False
        if not (isinstance(entry, dict) and "step" in entry):
            return False
    return True


def check_experiment_dir(exp_dir: Path) -> None:
    """``check_output`` of ``trainer.exp_dir``: refuse it where it is a file, lies inside other usmkit work,
    holds usmkit work other than an experiment (a checkpoint, a run's checkpoints folder, a corpus or Shar
    folder, an export), holds a config.yaml or metrics.jsonl that is not a training run's (``is_experiment``),
    or is any other non-empty folder: a run writes its config, tokenizer, statistics, logs and checkpoints
    into it, over what is there. A new or empty folder, and an experiment directory (a run to resume, or one
    whose earlier run the run itself refuses), pass."""
    exp_dir = Path(exp_dir)
    shown, todo = f"trainer.exp_dir={exp_dir}", "choose another trainer.exp_dir"
    if exp_dir.exists() and not exp_dir.is_dir():
        raise UsageError(f"{shown} exists and is not a folder; {todo}")
    check_writable(exp_dir, shown)
    found = folder_kind(exp_dir) if exp_dir.exists() else None
    if found is not None and found[0] != "experiment":  # what it is says most: said first
        raise UsageError(f"{shown} is {found[1]}, not an experiment directory: {_RUN_WRITES}; {todo}")
    check_not_inside_work(exp_dir, shown, todo=todo)
    if found is None and exp_dir.exists() and any(exp_dir.iterdir()):
        raise UsageError(f"{shown} is a folder of other files, not an experiment directory: {_RUN_WRITES}; {todo}")
    if found is not None and not is_experiment(exp_dir):
        raise UsageError(
            f"{shown} is a folder whose config.yaml or metrics.jsonl is not a training run's, not an experiment "
            f"directory: {_RUN_WRITES}; {todo}"
        )


def check_output_file(
    out: Path,
    *,
    option: str,
    own_words: str,
    own_keys: tuple[str, ...],
    inputs: Iterable[tuple[str, Path]] = (),
    home: Iterable[Path] = (),
) -> None:
    """``check_output`` of the JSON result file ``out`` (given as ``option``, e.g. ``output=`` or ``--json``):
    an existing non-empty file must be this command's own earlier result, a JSON object holding ``own_keys``
    (``own_words`` names it in the message). Called before any work, so a slip such as
    ``output=exp/run/checkpoints/step-000100/model.safetensors`` costs nothing and replaces nothing."""
    check_output(
        out, option=option, own_words=f"{own_words} (a JSON object with {', '.join(own_keys)})",
        own=lambda p: _is_json_object_with(p, own_keys), folder=False, inputs=inputs, home=home,
    )  # fmt: skip


def _is_json_object_with(path: Path, keys: tuple[str, ...]) -> bool:
    try:
        with path.open("rb") as f:
            if f.read(64).lstrip()[:1] != b"{":  # not JSON: weights, audio, YAML; nothing more is read
                return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in keys)
