"""The trainer on real batches: eager against ``trainer.compile=true`` with each compile scope and mode.

    python bench/trainer_compile.py [--model base] [--data synth] [--steps 300] [--variants ...]
        [--variant-timeout 600] [--json OUT]

Each variant is one ``python -m usmkit.train`` run (its own process, so compile caches and CUDA
state never carry over) on the same corpus, seed and steps, with the time axis padded to multiples
of 256 feature frames (``data.pad_to_frames=256``, what ``trainer.compile=true`` is meant with) and
lhotse's bucketing sampler varying the batch size. Variants:

- ``eager``: ``trainer.compile=false``.
- ``whole`` / ``blocks``: ``trainer.compile_scope`` (the whole step as one graph, or each Conformer
  block and the front end on its own).
- a ``_cg`` suffix: ``trainer.compile_mode=reduce-overhead`` (CUDA graphs).

Reported per variant: seconds from launch to the first logged window (process start, data,
compilation: ``first_log_s``), to the end (``wall_s``), the median of the trainer's own
``train/frames_per_s`` over the windows after the first third of the run (``frames_per_s``, feature
frames of the batches' valid audio), and the loss at the last step. The inductor cache directory is
per variant and starts empty, so every variant compiles from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "eager": ["trainer.compile=false"],
    "whole": ["trainer.compile=true", "trainer.compile_scope=whole"],
    "blocks": ["trainer.compile=true", "trainer.compile_scope=blocks"],
    "whole_cg": ["trainer.compile=true", "trainer.compile_scope=whole", "trainer.compile_mode=reduce-overhead"],
    "blocks_cg": ["trainer.compile=true", "trainer.compile_scope=blocks", "trainer.compile_mode=reduce-overhead"],
}


def run_variant(name: str, args, work: Path) -> dict:
    exp = work / name
    overrides = [
        "recipe=stage3_ctc",
        f"model={args.model}",
        f"data={args.data}",
        f"data.manifest_dir={args.manifest_dir}",
        "data.pad_to_frames=256",
        f"data.num_workers={args.num_workers}",
        f"trainer.max_steps={args.steps}",
        f"trainer.log_every={args.log_every}",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        f"trainer.exp_dir={exp}",
        *VARIANTS[name],
    ]
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor_{name}"), "PYTHONPATH": str(ROOT)}
    metrics = exp / "metrics.jsonl"
    log_path = work / f"{name}.log"
    t0 = time.perf_counter()
    first_log_s = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "usmkit.train", *overrides], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        while proc.poll() is None:  # note when the first window is logged: start-up and compilation
            if first_log_s is None and metrics.exists() and metrics.stat().st_size > 0:
                first_log_s = time.perf_counter() - t0
            if time.perf_counter() - t0 > args.variant_timeout:
                proc.kill()
                proc.wait()
                rows = metrics.read_text().splitlines() if metrics.exists() else []
                last = json.loads(rows[-1])["step"] if rows else 0
                return {"error": f"stopped after {args.variant_timeout} s at step {last} of {args.steps}"}
            time.sleep(0.2)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log_path.read_text()[-600:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [r for r in rows if "train/frames_per_s" in r]
    steady = train[len(train) // 3 :]
    return {
        "first_log_s": round(first_log_s if first_log_s is not None else wall_s, 1),
        "wall_s": round(wall_s, 1),
        "frames_per_s": round(statistics.median(r["train/frames_per_s"] for r in steady)),
        "windows": len(steady),
        "last_loss": round(train[-1]["train/loss"], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="base")
    ap.add_argument("--data", default="synth")
    ap.add_argument("--manifest-dir", default="data/synth")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--num-workers", type=int, default=4)
    ap.add_argument("--variants", default="eager,whole,blocks,whole_cg,blocks_cg")
    ap.add_argument("--variant-timeout", type=float, default=600.0, help="seconds before a variant is stopped")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "bench/results"), "trainer_compile.json"))
    args = ap.parse_args()
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "command": "python bench/trainer_compile.py " + " ".join(sys.argv[1:]),
        "model": args.model,
        "data": args.data,
        "steps": args.steps,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="trainer_compile_") as tmp:
        for name in args.variants.split(","):
            r = run_variant(name, args, Path(tmp))
            result["variants"][name] = r
            print(f"{name:10s} {json.dumps(r)}", flush=True)
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2))
    eager = result["variants"].get("eager", {}).get("frames_per_s")
    print(f"\n{'variant':10s} {'first log s':>11s} {'wall s':>7s} {'frames/s':>9s} {'vs eager':>8s} {'last loss':>9s}")
    for name, r in result["variants"].items():
        if "error" in r:
            print(f"{name:10s} {r['error'][:80]}")
            continue
        ratio = f"{r['frames_per_s'] / eager:.2f}x" if eager else ""
        print(
            f"{name:10s} {r['first_log_s']:11.1f} {r['wall_s']:7.1f} {r['frames_per_s']:9d} {ratio:>8s} {r['last_loss']:9.4f}"
        )


if __name__ == "__main__":
    main()
