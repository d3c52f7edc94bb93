"""Checkpoints: weights as safetensors + a train-state file, written atomically.

Layout of one checkpoint directory (``<exp_dir>/checkpoints/step-000200/``)::

    model.safetensors   the task module's state dict (encoder.*, heads, ...)
    train_state.pt      optimizer, scheduler, sampler, RNG states, step, epoch, best metric
    config.yaml         the full resolved config that produced it

A checkpoint is written to a temporary sibling directory and renamed into place only once every
file is complete and fsync'ed, so a crash or a full disk mid-write never damages an existing
checkpoint. Old checkpoints are pruned only after the new one is in place.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
CONFIG_FILE = "config.yaml"
BEST_FILE = "best.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or does not fit the model."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int


def list_checkpoints(ckpt_root: Path) -> list[CheckpointInfo]:
    """Complete checkpoints under ``ckpt_root``, oldest first (temporary directories are ignored)."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for p in ckpt_root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / MODEL_FILE).is_file() and (p / STATE_FILE).is_file():
            found.append(CheckpointInfo(p, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(ckpt_root: Path) -> CheckpointInfo | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1] if ckpts else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _state_dict_for_save(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors that share storage (tied weights); clone makes them independent.
    seen: set[int] = set()
    out = {}
    for k, v in module.state_dict().items():
        v = v.detach().cpu()
        key = v.untyped_storage().data_ptr()
        out[k] = v.clone() if key in seen else v.contiguous()
        seen.add(key)
    return out


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    module: torch.nn.Module,
    train_state: dict[str, Any],
    config_yaml: str,
) -> Path:
    """Write ``ckpt_root/step-{step:06d}`` atomically and return its path.

    On any failure (e.g. ``OSError: No space left on device``) the temporary directory is removed,
    existing checkpoints are untouched, and ``CheckpointError`` says what happened.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:06d}-", dir=ckpt_root))
    try:
        save_file(_state_dict_for_save(module), str(tmp / MODEL_FILE))
        torch.save(train_state, tmp / STATE_FILE)
        (tmp / CONFIG_FILE).write_text(config_yaml)
        for name in (MODEL_FILE, STATE_FILE, CONFIG_FILE):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_root)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"could not write checkpoint {final} ({type(e).__name__}: {e}); "
            f"earlier checkpoints in {ckpt_root} are untouched. Free disk space or change trainer.exp_dir."
        ) from e
    return final


def prune_checkpoints(ckpt_root: Path, keep_last: int, keep: set[Path]) -> None:
    """Delete all but the newest ``keep_last`` checkpoints, never one in ``keep`` (e.g. the best)."""
    ckpts = list_checkpoints(ckpt_root)
    doomed = ckpts[:-keep_last] if keep_last > 0 else ckpts
    for c in doomed:
        if c.path.resolve() not in {k.resolve() for k in keep}:
            shutil.rmtree(c.path, ignore_errors=True)
    for p in ckpt_root.glob(".tmp-step-*"):  # leftovers of a crash mid-write
        shutil.rmtree(p, ignore_errors=True)


def write_best(ckpt_root: Path, path: Path, metric: str, value: float, step: int) -> None:
    tmp = ckpt_root / (BEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"path": path.name, "metric": metric, "value": value, "step": step}))
    os.replace(tmp, ckpt_root / BEST_FILE)


def read_best(ckpt_root: Path) -> dict | None:
    p = ckpt_root / BEST_FILE
    return json.loads(p.read_text()) if p.is_file() else None


def run_dir(ckpt: str | Path) -> Path:
    """The experiment directory of checkpoint ``<exp_dir>/checkpoints/step-N``: where the training run
    keeps what travels with its checkpoints (feature stats, tokenizer)."""
    return Path(ckpt).parent.parent


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint directory, an experiment dir (its best, else latest), or a checkpoints root."""
    p = Path(path)
    if (p / MODEL_FILE).is_file():
        return p
    for root in (p / "checkpoints", p):
        best = read_best(root)
        if best and (root / best["path"] / MODEL_FILE).is_file():
            return root / best["path"]
        last = latest_checkpoint(root)
        if last:
            return last.path
    raise FileNotFoundError(
        f"no checkpoint found at {p}: expected a directory holding {MODEL_FILE} "
        f"(e.g. exp/run/checkpoints/step-000200) or an experiment directory with checkpoints/"
    )


def load_weights(
    module: torch.nn.Module,
    ckpt_dir: Path,
    prefix: str = "",
    strict: bool = True,
) -> list[str]:
    """Load ``model.safetensors`` into ``module`` (optionally only keys under ``prefix``, e.g. ``encoder.``).

    Shape or name mismatches raise ``CheckpointError`` listing the offending keys, typically because
    the checkpoint was trained with another model size. Returns the keys that were loaded.
    """
    weights = load_file(str(Path(ckpt_dir) / MODEL_FILE))
    if prefix:
        weights = {k: v for k, v in weights.items() if k.startswith(prefix)}
        if not weights:
            raise CheckpointError(f"{ckpt_dir} has no weights under '{prefix}'")
    own = module.state_dict()
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in weights.items()
        if k in own and own[k].shape != v.shape
    ]
    unexpected = [k for k in weights if k not in own]
    missing = [k for k in own if k.startswith(prefix) and k not in weights] if strict else []
    if mismatched or unexpected or missing:
        lines = [f"checkpoint {ckpt_dir} does not fit this model (was it trained with another model size?)"]
        for title, keys in (("shape mismatch", mismatched), ("unexpected", unexpected), ("missing", missing)):
            if keys:
                shown = keys[:20] + ([f"... and {len(keys) - 20} more"] if len(keys) > 20 else [])
                lines.append(f"  {title} ({len(keys)}): " + "; ".join(shown))
        raise CheckpointError("\n".join(lines))
    module.load_state_dict(weights, strict=False)
    return list(weights)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
