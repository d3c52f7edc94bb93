"""Checkpoints: weights as safetensors + a train-state file, written atomically.

Layout of one checkpoint directory (``<exp_dir>/checkpoints/step-000200/``)::

    model.safetensors         the task module's state dict (encoder.*, heads, ...)
    train_state.json          optimizer, scheduler, sampler, RNG states, step, epoch, best metric:
                              everything but the tensors, plus the size and SHA-256 of the other files
    train_state.safetensors   the train state's tensors (optimizer moments, RNG states), by key
    config.yaml               the full resolved config that produced it
    optimizer/                trainer.strategy=fsdp only: the optimizer state, sharded
                              (``usmkit.checkpointing.sharded``; train_state.safetensors then has no moments)

Nothing in a checkpoint is pickled, so a checkpoint from elsewhere cannot run code when loaded.
Every load checks the files it reads against the recorded sizes and SHA-256 (``verify_checkpoint``):
a file damaged after it was written is named, never silently decoded. An averaged checkpoint
(``usmkit.checkpointing.average``) has no train state and records its sums in ``average.json``.
A checkpoint is written to a temporary sibling directory and renamed into place only once every
file is complete and fsync'ed, so a crash or a full disk mid-write never damages an existing
checkpoint. Old checkpoints are pruned only after the new one is in place. What a checkpoint holds can be
taken into host memory first (``checkpoint_content``) and written later (``write_checkpoint``), e.g. by
a background thread (``usmkit.checkpointing.async_save``): the files are the same either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from usmkit.checkpointing.atomic import disk_full_reason, replaced_atomically, replaced_dir_atomically
from usmkit.errors import UsageError

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.json"
STATE_TENSORS_FILE = "train_state.safetensors"
CONFIG_FILE = "config.yaml"
BEST_FILE = "best.json"
AVERAGE_FILE = "average.json"  # an averaged checkpoint's record: the steps averaged, sizes and SHA-256


class CheckpointError(UsageError, RuntimeError):
    """A checkpoint that cannot be read or does not fit the model."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint file that is missing, truncated or altered (resume falls back to an older one)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (e.g. a full disk); the earlier ones are intact."""

    exit_code = 1


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
        if m and all((p / name).is_file() for name in (MODEL_FILE, STATE_FILE, STATE_TENSORS_FILE)):
            found.append(CheckpointInfo(p, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(ckpt_root: Path) -> CheckpointInfo | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1] if ckpts else None


def tensors_for_save(state_dict: dict[str, torch.Tensor], copy: bool = False) -> dict[str, torch.Tensor]:
    """A state dict as safetensors stores it: on the CPU, contiguous, no two tensors sharing storage.
    ``copy``: every tensor is a copy of its own, so the live ones may change while it is written."""
    if copy:
        return {k: _host_copy(v) for k, v in state_dict.items()}
    # safetensors refuses tensors that share storage (tied weights); clone makes them independent.
    seen: set[int] = set()
    out = {}
    for k, v in state_dict.items():
        v = v.detach().cpu()
        key = v.untyped_storage().data_ptr()
        out[k] = v.clone() if key in seen else v.contiguous()
        seen.add(key)
    return out


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in host memory, sharing nothing with it."""
    return t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)


@dataclass(frozen=True)
class CheckpointContent:
    """What one checkpoint holds, in host memory: the weights as safetensors stores them, the train state
    split by ``encode_state`` (a JSON-able tree and its tensors, copies of their own) and the config."""

    weights: dict[str, torch.Tensor]
    state_tree: Any
    state_tensors: dict[str, torch.Tensor]
    config_yaml: str


def checkpoint_content(
    module: torch.nn.Module, train_state: dict[str, Any], config_yaml: str, copy: bool = False
) -> CheckpointContent:
    """What ``save_checkpoint`` writes of ``module`` and ``train_state``. ``copy``: the weights are copied
    too (the train state's tensors always are), so the content stays as it is while the model and the
    optimizer go on changing in place."""
    tree, tensors = encode_state(train_state)
    return CheckpointContent(tensors_for_save(module.state_dict(), copy=copy), tree, tensors, config_yaml)


def checkpoint_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step-{step:06d}"


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
    return write_checkpoint(ckpt_root, step, checkpoint_content(module, train_state, config_yaml))


def write_checkpoint(ckpt_root: Path, step: int, content: CheckpointContent) -> Path:
    """Write ``content`` as ``ckpt_root/step-{step:06d}``, atomically, as ``save_checkpoint`` does."""
    final = checkpoint_dir(ckpt_root, step)
    try:
        with replaced_dir_atomically(final, durable=True) as tmp:
            save_file(content.weights, str(tmp / MODEL_FILE))
            save_file(content.state_tensors, str(tmp / STATE_TENSORS_FILE))
            (tmp / CONFIG_FILE).write_text(content.config_yaml)
            record = file_record(tmp, (MODEL_FILE, STATE_TENSORS_FILE, CONFIG_FILE))
            (tmp / STATE_FILE).write_text(json.dumps({"format": 1, **record, "state": content.state_tree}))
    except Exception as e:
        what = disk_full_reason(e, ckpt_root)
        raise CheckpointWriteError(
            f"could not write checkpoint {final} ({what}); "
            f"earlier checkpoints in {ckpt_root} are untouched. Free disk space (or move the "
            "experiment folder to a disk with room and name it in trainer.exp_dir), then resume with resume=true."
        ) from e
    return final


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_record(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{"sha256": {name: hex}, "bytes": {name: size}}`` of the files ``names`` in ``folder``: what a
    checkpoint records of its files so that every load can check them (``verify_checkpoint``)."""
    names = list(names)
    return {
        "sha256": {name: _sha256(folder / name) for name in names},
        "bytes": {name: (folder / name).stat().st_size for name in names},
    }


def recorded_files(ckpt_dir: Path) -> tuple[Path, dict[str, str], dict[str, int]] | None:
    """(the record file, SHA-256 by file name, sizes by file name) of checkpoint ``ckpt_dir``: from its
    ``train_state.json``, else (an averaged checkpoint) its ``average.json``; None where it has neither
    (a checkpoint of an older format, or weights copied by hand). ``CheckpointDamaged`` for a record
    that is unreadable."""
    for name in (STATE_FILE, AVERAGE_FILE):
        path = Path(ckpt_dir) / name
        if not path.is_file():
            continue
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            digests, sizes = meta["sha256"], meta.get("bytes", {})
            if not (isinstance(digests, dict) and isinstance(sizes, dict)):
                raise TypeError("sha256 and bytes must be mappings")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointDamaged(f"{path} is damaged ({type(e).__name__}: {e})") from None
        return path, digests, sizes
    return None


_UNRECORDED_WARNED: set[Path] = set()
_RESTORE = "; copy the checkpoint again from where the run wrote it"


def verify_checkpoint(ckpt_dir: Path, names: Iterable[str] | None = None) -> bool:
    """Check the files ``names`` of checkpoint ``ckpt_dir`` (default: every file it records) against the
    sizes (cheap, first) and SHA-256 recorded when it was written; a file the record does not list
    is not checked. Returns False, with a warning, where the checkpoint records nothing (older formats).

    Raises ``CheckpointDamaged`` naming the first file that is missing, of another size or altered."""
    ckpt_dir = Path(ckpt_dir)
    found = recorded_files(ckpt_dir)
    if found is None:
        if ckpt_dir.resolve() not in _UNRECORDED_WARNED:  # once per checkpoint, not once per file
            _UNRECORDED_WARNED.add(ckpt_dir.resolve())
            log.warning(
                "%s records no SHA-256 of its files (no %s or %s): its files are loaded unchecked",
                ckpt_dir,
                STATE_FILE,
                AVERAGE_FILE,
            )
        return False
    record, digests, sizes = found
    wanted = [n for n in (digests if names is None else names) if n in digests]
    for name in wanted:
        path = ckpt_dir / name
        if not path.is_file():
            raise CheckpointDamaged(f"{path} is missing (listed in {record})")
        size = path.stat().st_size
        if name in sizes and size != sizes[name]:
            raise CheckpointDamaged(
                f"{path} is damaged: {size} bytes where {record.name} records {sizes[name]} (truncated, "
                f"overwritten or edited since it was written){_RESTORE}"
            )
    for name in wanted:
        if _sha256(ckpt_dir / name) != digests[name]:
            raise CheckpointDamaged(
                f"{ckpt_dir / name} is damaged: its SHA-256 does not match the one in {record.name}{_RESTORE}"
            )
    return True


# ---- the train state as JSON + tensors -----------------------------------------------------------


def encode_state(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """A nested train state (dicts, lists, tuples, numbers, strings, None, tensors, numpy arrays) ->
    (a JSON-able tree, the tensors by key). Tuples and dicts with non-string keys (optimizer state is
    keyed by parameter index) are tagged so ``decode_state`` gives back the same types."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = _host_copy(x)
            return {"__tensor__": key}
        if isinstance(x, np.ndarray):
            key = f"t{len(tensors)}"
            arr = np.ascontiguousarray(x)
            stored = arr.view(np.int32) if arr.dtype == np.uint32 else arr  # safetensors has no uint32
            tensors[key] = torch.from_numpy(stored.copy())
            return {"__ndarray__": key, "dtype": str(arr.dtype)}
        if isinstance(x, np.generic):
            return enc(x.item())
        if x is None or isinstance(x, bool | int | str):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__float__": repr(x)}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: enc(v) for k, v in x.items()}
            if not all(isinstance(k, str | int) for k in x):
                raise TypeError(f"train state dict keys must be str or int, got {[type(k) for k in x]}")
            return {"__items__": [[k, enc(v)] for k, v in x.items()]}
        raise TypeError(f"train state holds a {type(x).__name__}, which is not stored without pickle")

    return enc(obj), tensors


def decode_state(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of ``encode_state``."""

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__tensor__" in x:
            return tensors[x["__tensor__"]]
        if "__ndarray__" in x:
            arr = tensors[x["__ndarray__"]].numpy()
            return arr.view(np.uint32) if x["dtype"] == "uint32" else arr.astype(x["dtype"], copy=False)
        if "__float__" in x:
            return float(x["__float__"])
        if "__tuple__" in x:
            return tuple(dec(v) for v in x["__tuple__"])
        if "__items__" in x:
            return {k: dec(v) for k, v in x["__items__"]}
        return {k: dec(v) for k, v in x.items()}

    return dec(tree)


def load_train_state(ckpt_dir: Path, verify: bool = True) -> dict[str, Any]:
    """The train state of a checkpoint, checked against the recorded SHA-256 of its tensor files
    (``verify=False``: not checked, e.g. on the processes of a sharded run whose rank 0 checked them).

    Raises ``CheckpointError`` naming the file that is missing, damaged or does not match."""
    ckpt_dir = Path(ckpt_dir)
    state_path = ckpt_dir / STATE_FILE
    if not state_path.is_file():
        legacy = ckpt_dir / "train_state.pt"
        hint = (
            f" ({legacy.name} is an older pickled format, which is not loaded because a pickle can run code; "
            "its weights still load, e.g. as trainer.init_from)"
            if legacy.is_file()
            else ""
        )
        raise CheckpointDamaged(f"{state_path} is missing{hint}")
    try:
        meta = json.loads(state_path.read_text(encoding="utf-8"))
        tree = meta["state"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged(f"{state_path} is damaged ({type(e).__name__}: {e})") from None
    if verify:
        verify_checkpoint(ckpt_dir)
    return decode_state(tree, load_tensors(ckpt_dir / STATE_TENSORS_FILE))


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; ``CheckpointDamaged`` naming it when it is missing or unreadable."""
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointDamaged(f"{path} is missing") from None
    except Exception as e:  # safetensors raises SafetensorError / OSError with no file name
        raise CheckpointDamaged(f"{path} is damaged or not a safetensors file ({type(e).__name__}: {e})") from None


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
    with replaced_atomically(ckpt_root / BEST_FILE) as tmp:
        tmp.write_text(json.dumps({"path": path.name, "metric": metric, "value": value, "step": step}))


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
    verify: bool = True,
) -> list[str]:
    """Load ``model.safetensors`` into ``module`` (optionally only keys under ``prefix``, e.g. ``encoder.``),
    after checking its size and SHA-256 (``verify_checkpoint``; ``verify=False`` where the caller has
    just checked them, e.g. resume's ``load_train_state``).

    Shape or name mismatches raise ``CheckpointError`` listing the offending keys, typically because
    the checkpoint was trained with another model size. Returns the keys that were loaded.
    """
    if verify:
        verify_checkpoint(Path(ckpt_dir), (MODEL_FILE,))
    weights = load_tensors(Path(ckpt_dir) / MODEL_FILE)
    if prefix:
        weights = {k: v for k, v in weights.items() if k.startswith(prefix)}
    check_fit(
        {k: v.shape for k, v in module.state_dict().items()},
        {k: v.shape for k, v in weights.items()},
        ckpt_dir,
        prefix,
        strict,
    )
    module.load_state_dict(weights, strict=False)
    return list(weights)


def check_fit(
    own: dict[str, torch.Size], stored: dict[str, torch.Size], ckpt_dir: Path, prefix: str = "", strict: bool = True
) -> None:
    """``CheckpointError`` listing the keys of ``stored`` (shapes of a checkpoint's weights under
    ``prefix``) that do not fit ``own`` (the model's), and with ``strict`` the model's keys it lacks."""
    if prefix and not stored:
        raise CheckpointError(f"{ckpt_dir} has no weights under '{prefix}'")
    mismatched = [
        f"{k}: checkpoint {tuple(shape)} vs model {tuple(own[k])}"
        for k, shape in stored.items()
        if k in own and own[k] != shape
    ]
    unexpected = [k for k in stored if k not in own]
    missing = [k for k in own if k.startswith(prefix) and k not in stored] if strict else []
    if mismatched or unexpected or missing:
        lines = [f"checkpoint {ckpt_dir} does not fit this model (was it trained with another model size?)"]
        for title, keys in (("shape mismatch", mismatched), ("unexpected", unexpected), ("missing", missing)):
            if keys:
                shown = keys[:20] + ([f"... and {len(keys) - 20} more"] if len(keys) > 20 else [])
                lines.append(f"  {title} ({len(keys)}): " + "; ".join(shown))
        raise CheckpointError("\n".join(lines))


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
