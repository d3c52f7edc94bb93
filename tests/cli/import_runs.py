"""Two training steps of a recipe from an imported encoder, frozen throughout (the import tests of w2v-BERT and
NEST): the config, and the check that the trained checkpoint kept the import's weights."""

from __future__ import annotations

from pathlib import Path

import torch
from composed_config import train_config
from safetensors.torch import load_file

from usmkit.checkpointing.checkpoint import MODEL_FILE


def frozen_import_config(recipe: str, preset: str, overrides: str, imported: Path, corpus: Path, exp: Path):
    """``train_config`` of 2 steps of ``recipe`` with ``model=preset`` from ``imported``, encoder frozen both steps."""
    return train_config(
        f"recipe={recipe}", f"model={preset}", f"model.overrides={overrides}", f"init_from={imported}",
        f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "data.max_duration=20", "data.num_workers=0",
        "trainer.progress=false", "trainer.eval_every=0", "trainer.max_steps=2", "trainer.save_every=2",
        "optim.warmup_steps=1", "optim.freeze_encoder_steps=2",
    )  # fmt: skip


def kept_the_import(imported: Path, exp: Path) -> bool:
    """Every tensor of the import equals the run's step-2 checkpoint's."""
    before = load_file(imported / "checkpoints" / "step-000000" / MODEL_FILE)
    after = load_file(exp / "checkpoints" / "step-000002" / MODEL_FILE)
    return all(torch.equal(after[k], v) for k, v in before.items())
