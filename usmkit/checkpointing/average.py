"""Checkpoint averaging: the mean of the weights of a run's last N checkpoints, as a new checkpoint.

``usmkit-average exp/run --last 5`` (``usmkit.cli.average``) writes ``exp/run/checkpoints/avg-last5/``
(``model.safetensors``, ``config.yaml`` and ``average.json``: the steps averaged and the files' sizes and
SHA-256, which every load checks), which ``usmkit.cli.evaluate checkpoint=...``,
``usmkit-transcribe --checkpoint ...`` and ``init_from=...`` take like any checkpoint. Averaging the
checkpoints of the end of a run (as WeNet's ``average_model.py`` and ESPnet do) smooths the noise of
the last optimizer steps and usually lowers WER a little at no training cost.

Floating-point tensors are averaged in float64 and cast back; integer buffers (BatchNorm's
``num_batches_tracked``) are taken from the newest checkpoint. Checkpoints must hold the same keys
and shapes: a mix of runs or model sizes is refused with the offending file and keys. Each is checked
against its recorded SHA-256 before it is read. An existing output folder is replaced only when it is
an earlier average (``usmkit.checkpointing.output_dir``).

Write our own: it is a few lines over safetensors, and torch/torchaudio ship no averaging helper.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from usmkit.checkpointing.atomic import replaced_dir_atomically
from usmkit.checkpointing.checkpoint import (
    AVERAGE_FILE,
    CONFIG_FILE,
    MODEL_FILE,
    CheckpointError,
    CheckpointInfo,
    file_record,
    list_checkpoints,
    load_tensors,
    verify_checkpoint,
)
from usmkit.checkpointing.output_dir import check_output_dir
from usmkit.errors import UsageError


def average_state_dicts(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the ``model.safetensors`` in each checkpoint dir of ``paths`` (oldest first)."""
    if not paths:
        raise ValueError("average_state_dicts: no checkpoints given")
    verify_checkpoint(paths[0], (MODEL_FILE,))
    first = load_tensors(paths[0] / MODEL_FILE)
    sums = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in first.items()}
    for p in paths[1:]:
        verify_checkpoint(p, (MODEL_FILE,))
        sd = load_tensors(p / MODEL_FILE)
        if sd.keys() != sums.keys():
            diff = sorted(set(sd) ^ set(sums))
            raise CheckpointError(
                f"{p} holds other weights than {paths[0]} ({len(diff)} keys differ, e.g. {diff[:5]}): "
                "average checkpoints of one run only"
            )
        for k, v in sd.items():
            if v.shape != sums[k].shape:
                raise CheckpointError(
                    f"{p}: {k} has shape {tuple(v.shape)} but {paths[0]} has {tuple(sums[k].shape)}: "
                    "average checkpoints of one run only"
                )
            sums[k] = sums[k] + v.to(torch.float64) if v.is_floating_point() else v  # ints: keep the newest
    return {k: (v / len(paths)).to(first[k].dtype) if first[k].is_floating_point() else v for k, v in sums.items()}


def select_last(ckpt_root: Path, last: int) -> list[CheckpointInfo]:
    """The newest ``last`` step checkpoints under ``ckpt_root``, oldest first."""
    if last < 1:
        raise UsageError(f"--last must be >= 1, got {last}")
    found = list_checkpoints(ckpt_root)
    if len(found) < last:
        raise UsageError(
            f"{ckpt_root} holds {len(found)} checkpoint(s) ({[c.step for c in found]}) but --last {last} was asked: "
            "train with trainer.keep_last >= N (and trainer.save_every small enough) or average fewer"
        )
    return found[-last:]


def is_average(folder: Path) -> bool:
    """Whether ``folder`` is an averaged checkpoint (``average.json``, or, written before it, the
    ``averaged_steps`` of its weights' metadata)."""
    if (folder / AVERAGE_FILE).is_file():
        return True
    try:
        with safe_open(str(folder / MODEL_FILE), framework="pt") as f:
            return "averaged_steps" in (f.metadata() or {})
    except Exception:  # noqa: BLE001 - missing or unreadable: not an average of ours
        return False


def average_last(exp_dir: str | Path, last: int, out: str | Path | None = None) -> tuple[Path, list[int]]:
    """Average the last ``last`` checkpoints of ``exp_dir`` into ``out`` (default
    ``<exp_dir>/checkpoints/avg-last{last}``); returns ``out`` and the averaged steps. Written
    atomically, like a checkpoint; an existing ``out`` must be an earlier average (``check_output_dir``)."""
    exp_dir = Path(exp_dir)
    root = exp_dir / "checkpoints" if (exp_dir / "checkpoints").is_dir() else exp_dir
    out = Path(out) if out else root / f"avg-last{last}"
    check_output_dir(
        out, option="--out", own_kind="checkpoint", own_words="an averaged checkpoint", own=is_average, home=[exp_dir]
    )
    chosen = select_last(root, last)
    steps = [c.step for c in chosen]
    weights = average_state_dicts([c.path for c in chosen])
    verify_checkpoint(chosen[-1].path, (CONFIG_FILE,))
    with replaced_dir_atomically(out) as tmp:
        save_file(weights, str(tmp / MODEL_FILE), metadata={"averaged_steps": ",".join(map(str, steps))})
        shutil.copyfile(chosen[-1].path / CONFIG_FILE, tmp / CONFIG_FILE)
        record = file_record(tmp, (MODEL_FILE, CONFIG_FILE))
        sources = [str(c.path) for c in chosen]
        (tmp / AVERAGE_FILE).write_text(
            json.dumps({"format": 1, "averaged_steps": steps, "sources": sources, **record})
        )
    return out, steps
