"""What one run hands to another: its encoder (for ``init_from``), or all that decoding it needs (to decode on
another machine). Both copy the run's best checkpoint, else its latest, and write the copy atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from usmkit.checkpointing.atomic import replaced_dir_atomically
from usmkit.checkpointing.checkpoint import BEST_FILE, CONFIG_FILE, MODEL_FILE, resolve_checkpoint
from usmkit.data.normalize import STATS_FILE
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE

METRICS_FILE = "metrics.jsonl"


def save_encoder(exp: Path, dest: Path) -> None:
    """The encoder's weights (``init_from`` reads nothing else) of ``exp``'s best (else latest) checkpoint,
    with its config."""
    from safetensors.torch import load_file, save_file

    src = resolve_checkpoint(exp)
    weights = {k: v for k, v in load_file(src / MODEL_FILE).items() if k.startswith("encoder.")}
    with replaced_dir_atomically(dest) as tmp:
        save_file(weights, tmp / MODEL_FILE)
        (tmp / CONFIG_FILE).write_text((src / CONFIG_FILE).read_text())


def export_run(exp: Path, dest: Path) -> None:
    """What decoding ``exp`` needs, nothing more: its best (else latest) checkpoint's weights and config, the
    run's tokenizer and feature statistics, and its metrics; ``dest`` then decodes as ``exp`` would."""
    src = resolve_checkpoint(exp)
    with replaced_dir_atomically(dest) as tmp:
        ckpt = tmp / "checkpoints" / src.name
        ckpt.mkdir(parents=True)
        for f in (MODEL_FILE, CONFIG_FILE):
            shutil.copy2(src / f, ckpt / f)
        best = src.parent / BEST_FILE  # how the copy is found: as its run's best checkpoint
        best_json = json.loads(best.read_text()) if best.is_file() else {}
        if best_json.get("path") != src.name:
            best_json = {"path": src.name, "metric": "latest", "value": None, "step": None}
        (ckpt.parent / BEST_FILE).write_text(json.dumps(best_json))
        for f in (TOKENIZER_FILE, STATS_FILE, METRICS_FILE):
            shutil.copy2(exp / f, tmp / f)
