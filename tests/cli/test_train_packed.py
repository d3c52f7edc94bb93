"""Training on packed batches (``data.pack_to_frames``) end to end: CTC and BEST-RQ runs from the command
line, and a packed run stopped and resumed continues exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PACKED = [
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=15.36",  # 3 rows of 5.12 s
    "data.pack_to_frames=512",
    "data.max_cut_duration=5.12",
    "data.num_workers=0",
    "trainer.log_every=1",
    "trainer.progress=false",
    "trainer.eval_every=0",
    "optim.warmup_steps=2",
    "optim.schedule=constant",
]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "usmkit.cli.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise AssertionError(f"train {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def _losses(exp: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture(scope="module")
def corpus(synth_corpus) -> Path:
    return synth_corpus


def test_packed_ctc_run_resumes_exactly(corpus, tmp_path):
    def args(exp: Path, *extra: str) -> list[str]:
        return ["recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", *PACKED, *extra]

    whole = tmp_path / "whole"
    proc = _run(args(whole, "trainer.max_steps=4", "trainer.save_every=2"), tmp_path)
    assert "packed into 3 rows of 512 frames" in proc.stdout + proc.stderr
    parts = tmp_path / "parts"
    _run(args(parts, "trainer.max_steps=2", "trainer.save_every=2"), tmp_path)
    _run(args(parts, "trainer.max_steps=4", "trainer.save_every=2", "resume=true"), tmp_path)
    want, got = _losses(whole), _losses(parts)
    assert sorted(want) == [1, 2, 3, 4]
    assert all(v == v and v < float("inf") for v in want.values())
    assert got == want


def test_packed_bestrq_run(corpus, tmp_path):
    exp = tmp_path / "exp"
    args = ["recipe=stage1", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", *PACKED, "trainer.max_steps=2"]
    _run([*args, "task.bestrq.num_codebooks=2", "task.bestrq.codebook_size=64"], tmp_path)
    losses = _losses(exp)
    assert sorted(losses) == [1, 2] and all(0 < v < float("inf") for v in losses.values())
