"""On ``resume=true``: the settings that decide what the trained weights are (the model's size, the task, the
vocabulary, the features they read) must be those the run was started with; the rest (``max_steps``, the
learning-rate schedule, loader workers, logging and evaluation intervals...) may change.

The run's config is its newest checkpoint's ``config.yaml``, the one its weights were trained under (else the
experiment directory's copy). A changed key is refused before anything is written, naming the key and both
values::

    resume=true: model.preset was tiny in /exp/run's checkpoints and is small now; ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from usmkit.checkpointing.checkpoint import CONFIG_FILE, latest_checkpoint
from usmkit.config import ConfigError, TrainConfig, from_dict, to_dict

# Dotted keys (and every key below them) a resumed run must keep.
FIXED_KEYS = (
    "task.kind",
    "task.las",
    "task.bestrq.num_codebooks",
    "task.bestrq.codebook_size",
    "task.bestrq.code_dim",
    "task.bestrq.stack_frames",
    "model.preset",
    "model.overrides",
    "model.subsampling_factor",
    "data.features",
    "vocab_size",
    "tokenizer_type",
)
# Keys below FIXED_KEYS that change how, not what, is computed: stored or on-the-fly features are the same.
FREE_KEYS = ("data.features.precomputed",)


def saved_run_config(exp_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """The config the run in ``exp_dir`` trained its newest checkpoint under, and the file it came from;
    None when there is no checkpoint (nothing to resume) or its config cannot be read as a mapping."""
    last = latest_checkpoint(exp_dir / "checkpoints")
    if last is None:
        return None
    for path in (last.path / CONFIG_FILE, exp_dir / CONFIG_FILE):
        try:
            saved = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(saved, dict):
            return saved, path
    return None


def check_resume_config(cfg: TrainConfig) -> None:
    """``ConfigError`` naming each ``FIXED_KEYS`` value that differs from the saved run's (``resume=true``)."""
    if not cfg.resume:
        return
    exp_dir = Path(cfg.trainer.exp_dir)
    found = saved_run_config(exp_dir)
    if found is None:
        return
    saved, path = found
    try:  # with the defaults of keys the file leaves out
        saved = to_dict(from_dict(TrainConfig, saved))
    except ConfigError:  # a config of an older schema: its keys as they are
        pass
    old, new = _leaves(saved), _leaves(to_dict(cfg))
    changed = [
        f"{key} was {_show(old.get(key))} in {path} and is {_show(new.get(key))} now"
        for key in sorted(set(old) | set(new))
        if _fixed(key) and _known(key, old) and old.get(key) != new.get(key)
    ]
    if changed:
        raise ConfigError(
            f"resume=true, but {'; '.join(changed)}: a run resumes with the settings its weights were trained "
            f"under. Drop the override(s) to continue the run in {exp_dir}, or start a new run in another "
            "trainer.exp_dir (init_from=<its checkpoint> to reuse the encoder)"
        )


def _fixed(key: str) -> bool:
    return key not in FREE_KEYS and any(key == k or key.startswith(k + ".") for k in FIXED_KEYS)


def _known(key: str, leaves: dict[str, Any]) -> bool:
    """Whether the saved config has ``key``, a key above it (``model.overrides: null``) or below it: a key
    an older version did not have is not compared."""
    return any(k == key or key.startswith(k + ".") or k.startswith(key + ".") for k in leaves)


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; an empty mapping or None is one leaf (None)."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out |= _leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(tree, tuple):
        tree = list(tree)
    return {prefix: None if tree == {} else tree}


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)
