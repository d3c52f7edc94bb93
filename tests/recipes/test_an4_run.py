"""recipes/an4/run.py: the encoder it hands from GPU pre-training to CPU fine-tuning (``--save-encoder``,
``--stage1``) loads as ``init_from`` into a CTC model and carries nothing but the encoder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from safetensors.torch import load_file

from usmkit.checkpointing.checkpoint import MODEL_FILE, load_weights, save_checkpoint
from usmkit.config import TaskConfig
from usmkit.models.presets import tiny
from usmkit.tasks import build_task

RUN = Path(__file__).resolve().parents[2] / "recipes" / "an4" / "run.py"


def _run_module():
    spec = importlib.util.spec_from_file_location("an4_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_saved_encoder_holds_only_the_encoder_and_initializes_a_ctc_model(tmp_path):
    encoder_cfg = tiny(subsampling_channels=32)
    bestrq = build_task(TaskConfig(kind="bestrq"), encoder_cfg, 0)
    save_checkpoint(tmp_path / "stage1" / "checkpoints", 10, bestrq, {"step": 10}, "task:\n  kind: bestrq\n")
    assert any(not k.startswith("encoder.") for k in bestrq.state_dict())  # the quantizer and heads

    _run_module().save_encoder(tmp_path / "stage1", tmp_path / "encoder")
    saved = load_file(tmp_path / "encoder" / MODEL_FILE)
    assert saved and all(k.startswith("encoder.") for k in saved)
    assert (tmp_path / "encoder" / "config.yaml").read_text() == "task:\n  kind: bestrq\n"

    ctc = build_task(TaskConfig(kind="ctc"), encoder_cfg, 30)
    loaded = load_weights(ctc, tmp_path / "encoder", prefix="encoder.")
    assert sorted(loaded) == sorted(k for k in ctc.state_dict() if k.startswith("encoder."))
    for k in loaded:
        torch.testing.assert_close(ctc.state_dict()[k], bestrq.state_dict()[k])
