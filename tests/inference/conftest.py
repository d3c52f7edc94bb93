"""Fixtures of the inference tests: tiny CTC and joint CTC/LAS checkpoints whose greedy transcripts have words.

A CTC model trained a few steps on the embedded corpus emits only blank, so its transcripts are all
empty and would match anything. ``teacher`` trains one 4 steps (the real run: tokenizer, feature
statistics, config naming the corpus, whose training transcripts the lexicon decoder reads), then
saves as its step 5 the same architecture re-initialized from a fixed seed, with the CTC head scaled
so that its frames go to blank about as often as to tokens: deterministic transcripts of many words
with confidences spread over a range, on which equality with ``usmkit.cli.evaluate`` says something.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.config import DataConfig, ModelSection, OptimConfig, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.runs import load_trained
from usmkit.tasks import build_task


@pytest.fixture(scope="session")
def teacher(synth_corpus, tmp_path_factory) -> Path:
    """The checkpoint directory (``<exp>/checkpoints/step-000005``) described in the module docstring."""
    return speaking_checkpoint(synth_corpus, tmp_path_factory.mktemp("batch_teacher") / "exp", TaskConfig(kind="ctc"))


@pytest.fixture(scope="session")
def las_teacher(synth_corpus, tmp_path_factory) -> Path:
    """The same as ``teacher`` for a joint CTC/LAS model (``task.kind=las``, CTC weight 0.3)."""
    task = TaskConfig(kind="las", ctc_weight=0.3)
    return speaking_checkpoint(synth_corpus, tmp_path_factory.mktemp("las_teacher") / "exp", task)


def speaking_checkpoint(corpus: Path, exp: Path, task: TaskConfig) -> Path:
    """A run of ``task`` trained 4 steps on ``corpus`` into ``exp``, then its step 5: the same architecture
    re-initialized from a fixed seed with the CTC head of the module docstring."""
    from usmkit.training.recipe import run

    cfg = TrainConfig(
        task=task,
        model=ModelSection(preset="tiny", overrides={"d_model": 64, "num_layers": 2, "num_heads": 2}),
        data=DataConfig(manifest_dir=str(corpus), max_duration=20.0, num_workers=0),
        optim=OptimConfig(warmup_steps=2, schedule="constant"),
        trainer=TrainerConfig(
            exp_dir=str(exp), max_steps=4, eval_every=0, save_every=4, progress=False, device="cpu", log_every=1
        ),
    )
    run(cfg, yaml.safe_dump(to_dict(cfg)))
    _, cfg, tokenizer, ckpt = load_trained(str(exp), "cpu")
    torch.manual_seed(0)
    module = build_task(
        cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), tokenizer.vocab_size
    )
    with torch.no_grad():
        module.ctc.proj.weight.mul_(3.0)  # sharper posteriors
        module.ctc.proj.bias[0] += 5.0  # blank wins about half the frames
    return save_checkpoint(exp / "checkpoints", 5, module.eval(), {}, (ckpt / "config.yaml").read_text())
