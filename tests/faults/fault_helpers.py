"""Helpers of the fault suite (imported by its conftest and tests): a tiny untrained CTC checkpoint (streamable),
speech-like audio, short training runs, and commands run as a user runs them.

The checkpoint's CTC head prefers one word-initial token everywhere, so the model "speaks" wherever
the audio does: what is transcribed, and what is lost, can be counted from the segments.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.data.features import fbank_extractor
from usmkit.data.normalize import STATS_FILE, FeatureStats
from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.tasks import build_task

REPO = Path(__file__).resolve().parents[2]
SR = 16000
TEXTS = ["the cat sat on the mat", "a dog ran to the park", "hello world this is a test"]


def speechlike(seconds: float, seed: int = 0, level: float = 0.1, sr: int = SR) -> np.ndarray:
    """Harmonics of a wandering pitch under a syllable-rate envelope, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    phase = 2 * np.pi * np.cumsum(120 + 40 * np.sin(2 * np.pi * 1.3 * t)) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * t)
    return (level * envelope * voiced + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


def speech_silence_speech(sr: int = SR) -> np.ndarray:
    """1.2 s speech, 1.2 s digital silence, 1.2 s speech: two segments."""
    return np.concatenate([speechlike(1.2, 1, sr=sr), np.zeros(int(1.2 * sr), np.float32), speechlike(1.2, 2, sr=sr)])


def make_ctc_checkpoint(root: Path) -> Path:
    """Experiment dir ``root`` with checkpoints/step-000001 (tiny causal CTC model), tokenizer and stats."""
    tokenizer = Tokenizer.train(TEXTS, root / "tokenizer", vocab_size=minimum_vocab_size(TEXTS))
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset="tiny", chunk_size=4, left_chunks=2, causal_conv=True, dropout=0.0),
        data=DataConfig(manifest_dir=str(root / "no-manifests")),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tokenizer.path),
    )
    torch.manual_seed(0)
    module = build_task(
        cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), tokenizer.vocab_size
    )
    word = next(i for i in tokenizer.encode("cat") if tokenizer.decode([i]).strip())
    with torch.no_grad():
        module.ctc.proj.weight.zero_()
        module.ctc.proj.bias.zero_()
        module.ctc.proj.bias[word] = 5.0
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    feats = torch.as_tensor(fbank_extractor(cfg.data.features).extract(speechlike(2.0), SR))  # (T, 80)
    FeatureStats(mean=feats.mean(0), std=feats.std(0).clamp_min(1e-5)).save(root / STATS_FILE, cfg.data.features)
    return root


# ---- short training runs on a copy of the embedded corpus ------------------------------------------
FAST_TRAIN = [  # 6 steps of a 2-layer CTC model, a checkpoint every 2 steps (about 10 s on a CPU)
    "recipe=stage3_ctc",
    "model=tiny",
    "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}",
    "data.max_duration=20",
    "trainer.log_every=1",
    "trainer.progress=false",
    "trainer.eval_every=0",
    "trainer.save_every=2",
    "trainer.max_steps=6",
    "trainer.keep_last=5",
    "optim.warmup_steps=2",
]


FAST_TRAIN_WORKERS = [*FAST_TRAIN, "data.num_workers=2"]  # several loader workers, the default augmentation on


def fast_config(corpus: Path, exp: Path, *extra: str):
    """(TrainConfig, its YAML) of ``FAST_TRAIN`` on ``corpus`` into ``exp``, plus ``extra`` overrides."""
    from composed_config import train_config

    return train_config(*FAST_TRAIN, f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", *extra)


def fast_train(corpus: Path, exp: Path, *extra: str) -> dict:
    from usmkit.training.recipe import run

    return run(*fast_config(corpus, exp, *extra))


def worker_config(corpus: Path, exp: Path, *extra: str):
    """``fast_config`` with ``FAST_TRAIN_WORKERS``."""
    return fast_config(corpus, exp, "data.num_workers=2", *extra)


def worker_train(corpus: Path, exp: Path, *extra: str) -> dict:
    return fast_train(corpus, exp, "data.num_workers=2", *extra)


def metrics(exp: Path) -> list[tuple[int, float]]:
    """(step, training loss) of every logged step of the run in ``exp``."""
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


# ---- commands as a user runs them ---------------------------------------------------------------------
def user_env(cwd: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}


def run_module(*args: str, cwd: Path, stdin: bytes | None = None, text: bool = False) -> subprocess.CompletedProcess:
    """``python -m ARGS`` as a user runs it, with this tree first on the path."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env=user_env(cwd),
        capture_output=True,
        timeout=300,
        input=stdin,
        text=text,
    )


run_text = functools.partial(run_module, text=True)


def expect_one_error_line(proc: subprocess.CompletedProcess, *named: str, code: int = 2) -> str:
    """The one ``error`` line of a finished command that exited ``code``, holding every word of ``named``."""
    err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else proc.stderr
    assert proc.returncode == code, err[-3000:]
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for word in named:
        assert word in lines[0], lines[0]
    return lines[0]


def one_error_line(err: str) -> str:
    """The one non-empty line of ``err`` (captured stderr), with no traceback."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def wav_declaring(path: Path, rate: int) -> Path:
    """One second of speech-like 16 kHz samples in a WAV whose header says ``rate``."""
    import soundfile as sf

    sf.write(path, speechlike(1.0), SR, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:32] = struct.pack("<II", rate, (2 * rate) & 0xFFFFFFFF)  # sample rate, byte rate
    path.write_bytes(bytes(data))
    return path


UNUSABLE_RATES = {1: "its sample rate, 1 Hz, is outside", 2_000_000_000: "2000000000 Hz, is outside",
                  44101: "44101 Hz cannot be resampled to 16000 Hz"}  # fmt: skip


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``path`` (created) with ``options`` ("size=64k", "ro,size=64k") for the test's
    duration: real full or read-only file systems. Root only: the test is skipped elsewhere."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]).returncode != 0:
        pytest.skip("mount -t tmpfs is not allowed here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)])
