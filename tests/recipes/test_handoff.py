"""usmkit.recipes.handoff: the encoder a BEST-RQ run hands to fine-tuning, and the copy of a run that decodes
as the run would on another machine."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from usmkit.checkpointing.checkpoint import MODEL_FILE, load_weights, resolve_checkpoint, save_checkpoint
from usmkit.config import TaskConfig
from usmkit.models.presets import tiny
from usmkit.recipes.handoff import export_run, save_encoder
from usmkit.tasks import build_task


def test_saved_encoder_holds_only_the_encoder_and_initializes_a_ctc_model(tmp_path):
    encoder_cfg = tiny(subsampling_channels=32)
    bestrq = build_task(TaskConfig(kind="bestrq"), encoder_cfg, 0)
    save_checkpoint(tmp_path / "stage1" / "checkpoints", 10, bestrq, {"step": 10}, "task:\n  kind: bestrq\n")
    assert any(not k.startswith("encoder.") for k in bestrq.state_dict())  # the quantizer and heads

    save_encoder(tmp_path / "stage1", tmp_path / "encoder")
    saved = load_file(tmp_path / "encoder" / MODEL_FILE)
    assert saved and all(k.startswith("encoder.") for k in saved)
    assert (tmp_path / "encoder" / "config.yaml").read_text() == "task:\n  kind: bestrq\n"

    ctc = build_task(TaskConfig(kind="ctc"), encoder_cfg, 30)
    loaded = load_weights(ctc, tmp_path / "encoder", prefix="encoder.")
    assert sorted(loaded) == sorted(k for k in ctc.state_dict() if k.startswith("encoder."))
    for k in loaded:
        torch.testing.assert_close(ctc.state_dict()[k], bestrq.state_dict()[k])


def test_an_exported_run_holds_its_best_checkpoint_and_what_decoding_reads(tmp_path):
    model = torch.nn.Linear(2, 2)
    exp = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(exp / "checkpoints", step, model, {"step": step}, f"step: {step}\n")
    (exp / "checkpoints" / "best.json").write_text(json.dumps({"path": "step-000001", "metric": "dev_wer"}))
    for name in ("tokenizer.model", "feature_stats.safetensors", "metrics.jsonl"):
        (exp / name).write_text(name)

    export_run(exp, tmp_path / "copy")
    assert resolve_checkpoint(tmp_path / "copy").name == "step-000001"  # the best, found as the best
    assert sorted(p.name for p in (tmp_path / "copy" / "checkpoints").iterdir()) == ["best.json", "step-000001"]
    assert (tmp_path / "copy" / "checkpoints" / "step-000001" / "config.yaml").read_text() == "step: 1\n"
    assert all((tmp_path / "copy" / n).read_text() == n for n in ("tokenizer.model", "metrics.jsonl"))
