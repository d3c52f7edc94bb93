"""The stage-2 recipe end to end on the tiny corpus: stage 1 -> stage 2 (resumed) -> stage 3 (CTC, or joint) and evaluation.

``python -m usmkit.cli.train recipe=stage2 init_from=<stage 1>`` trains from a BEST-RQ checkpoint on the three
streams, logs every loss and weight, picks its best checkpoint by dev WER, resumes exactly, and its weights
start stage 3 (``encoder.*``) and decode with ``usmkit.cli.evaluate``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from composed_config import train_config

from usmkit.inference.evaluate import EvalConfig, evaluate

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = [
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 3, num_heads: 2}",
    "data.max_duration=20",
    "data.num_workers=0",
    "trainer.log_every=1",
    "trainer.progress=false",
    "optim.warmup_steps=2",
]
SMALL_BESTRQ = ["task.bestrq.codebook_size=64", "task.bestrq.num_codebooks=2"]


def _train(*overrides: str) -> dict:
    """``python -m usmkit.cli.train <overrides>``, in this process."""
    from usmkit.training.recipe import run

    return run(*train_config(*overrides))


def _rows(exp: Path) -> list[dict]:
    return [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def runs(synth_corpus, tmp_path_factory) -> dict[str, Path]:
    """Stage 1 (2 steps); stage 2 from it for 4 steps, once straight through and once stopped at step 2 and
    resumed (text-only loss from step 3 on)."""
    cwd = tmp_path_factory.mktemp("most_recipe")
    corpus = cwd / "corpus"
    shutil.copytree(synth_corpus, corpus)  # training caches features and statistics next to the manifests
    data = f"data.manifest_dir={corpus}"
    stage1 = cwd / "stage1"
    _train("recipe=stage1", *FAST, *SMALL_BESTRQ, data, "trainer.max_steps=2", "trainer.eval_every=0",
           f"trainer.exp_dir={stage1}")  # fmt: skip
    stage2 = ["recipe=stage2", *FAST, *SMALL_BESTRQ, data, f"init_from={stage1}", "task.most.text_warmup_steps=2",
              "trainer.eval_every=2", "trainer.save_every=2", "optim.schedule=constant"]  # fmt: skip
    straight, resumed = cwd / "straight", cwd / "resumed"
    _train(*stage2, "trainer.max_steps=4", f"trainer.exp_dir={straight}")
    messages, logger = _Messages(), logging.getLogger("usmkit.training.recipe")
    level = logger.level
    logger.addHandler(messages)
    logger.setLevel(logging.INFO)
    try:
        _train(*stage2, "trainer.max_steps=2", f"trainer.exp_dir={resumed}")
    finally:
        logger.removeHandler(messages)
        logger.setLevel(level)
    # init_from a BEST-RQ checkpoint also carries its heads and quantizer into stage 2
    assert any("initialized 4 head tensors" in m and "bestrq.heads.weight" in m for m in messages.lines)
    _train(*stage2, "trainer.max_steps=4", f"trainer.exp_dir={resumed}", "resume=true")
    return {"cwd": cwd, "corpus": corpus, "stage1": stage1, "straight": straight, "resumed": resumed}


def test_stage2_logs_every_loss_its_weight_and_the_alignment_metrics(runs):
    rows = [r for r in _rows(runs["straight"]) if "train/loss" in r]
    losses = ("bestrq", "ctc", "duration", "consistency", "text")
    for row in rows:
        for name in ("bestrq", "ctc", "duration", "consistency"):
            assert row[f"train/weight_{name}"] == 1.0 and row[f"train/loss_{name}"] > 0
        assert {"train/dur_abs_log_err", "train/align_ok_frac", "train/bestrq_acc_mean"} <= set(row)
    assert [r["train/weight_text"] for r in rows] == [0.0, 0.0, 1.0, 1.0]  # text_warmup_steps=2
    assert all(f"train/loss_{n}" in rows[-1] for n in losses)
    dev = [r for r in _rows(runs["straight"]) if "dev/dev_wer" in r]
    assert [r["step"] for r in dev] == [2, 4]
    best = json.loads((runs["straight"] / "checkpoints" / "best.json").read_text())
    assert best["metric"] == "dev_wer"


def test_stage2_resumed_run_matches_the_uninterrupted_run(runs):
    def losses(exp):
        return {r["step"]: r["train/loss"] for r in _rows(exp) if "train/loss" in r}

    straight, resumed = losses(runs["straight"]), losses(runs["resumed"])
    assert set(resumed) == {1, 2, 3, 4}
    for step in (3, 4):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5), step


def test_stage2_weights_start_stage3_and_decode_with_evaluate(runs, caplog):
    cwd, stage2 = runs["cwd"], runs["straight"]
    with caplog.at_level(logging.INFO, logger="usmkit.training.recipe"):
        _train("recipe=stage3_ctc", *FAST, f"data.manifest_dir={runs['corpus']}", f"init_from={stage2}",
               "trainer.max_steps=1", "trainer.eval_every=0", f"trainer.exp_dir={cwd / 'stage3'}")  # fmt: skip
    assert any("encoder tensors from" in m and str(stage2) in m for m in caplog.messages)
    assert any("initialized the CTC head from" in m for m in caplog.messages)  # same tokenizer: the head too
    scored = evaluate(EvalConfig(checkpoint=str(stage2), test_sets=("test_textonly",)))["sets"]["test_textonly"]
    assert scored["utterances"] == 10 and 0 <= scored["cer"]


def test_stage3_joint_fine_tunes_a_stage2_model_with_its_text_losses_and_without_bestrq(runs, caplog):
    """``recipe=stage3_joint init_from=<stage 2>``: the stage-2 objective with BEST-RQ off and every other loss on
    from the first step, starting from the stage-2 run's encoder, text encoder and CTC head."""
    exp = runs["cwd"] / "joint"
    with caplog.at_level(logging.INFO, logger="usmkit.training.recipe"):
        _train("recipe=stage3_joint", *FAST, *SMALL_BESTRQ, f"data.manifest_dir={runs['corpus']}",
               f"init_from={runs['straight']}", "trainer.max_steps=2", "trainer.eval_every=2",
               f"trainer.exp_dir={exp}")  # fmt: skip
    heads = next(m for m in caplog.messages if "head tensors from" in m)
    assert "text_encoder." in heads and str(runs["straight"]) in heads
    rows = [r for r in _rows(exp) if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["train/weight_bestrq"] == 0.0 and "train/loss_bestrq" not in row
        for name in ("ctc", "duration", "consistency", "text"):
            assert row[f"train/weight_{name}"] == 1.0 and row[f"train/loss_{name}"] > 0
    scored = evaluate(EvalConfig(checkpoint=str(exp), test_sets=("test_textonly",)))["sets"]["test_textonly"]
    assert scored["utterances"] == 10


def test_stage2_under_torchrun_with_terms_held_back(runs, tmp_path):
    """DDP reduces every parameter each step: with the text-only and alignment losses held back in the first
    step (their parameters unused), stage 2 still trains in two processes."""
    exp = tmp_path / "ddp"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "usmkit.cli.train", "recipe=stage2", *FAST, *SMALL_BESTRQ, f"data.manifest_dir={runs['corpus']}",
            "task.most.text_warmup_steps=1", "task.most.align_warmup_steps=1", "trainer.max_steps=3",
            "trainer.eval_every=0", "trainer.save_every=3", "trainer.device=cpu", f"trainer.exp_dir={exp}"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [r["step"] for r in _rows(exp) if "train/loss" in r] == [1, 2, 3]
