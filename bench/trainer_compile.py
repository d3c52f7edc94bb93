"""The trainer on real batches: eager against ``trainer.compile=true`` with each compile scope and mode.

    python bench/trainer_compile.py [--model base] [--data synth] [--steps 300] [--variants ...]
        [--variant-timeout 600] [--json OUT]

Each variant is one ``python -m usmkit.cli.train`` run (its own process, so compile caches and CUDA
state never carry over) on the same corpus, seed and steps, with the time axis padded to multiples
of 256 feature frames (``data.pad_to_frames=256``, what ``trainer.compile=true`` is meant with) and
lhotse's bucketing sampler varying the batch size. Variants:

- ``eager``: ``trainer.compile=false``.
- ``whole`` / ``blocks``: ``trainer.compile_scope`` (the whole step as one graph, or each Conformer
  block and the front end on its own).
- a ``_cg`` suffix: ``trainer.compile_mode=reduce-overhead`` (CUDA graphs).

Reported per variant: seconds from launch to the first logged window (process start, data,
compilation: ``first_log_s``), to the end (``wall_s``) and to every tenth logged step
(``seconds_to_step``), the median of the trainer's own ``train/frames_per_s`` over the windows after
the first third of the run (``frames_per_s``, feature frames of the batches' valid audio), and the
loss at the last step. A variant still running after ``--variant-timeout`` seconds is stopped and
reports what it logged (``stopped``). The inductor cache directory is per variant and starts empty,
so every variant compiles from scratch.
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
from pathlib import Path

from tools.results import result_path, run_header, write_result

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
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor_{name}"), "PYTHONPATH": path}
    metrics = exp / "metrics.jsonl"
    log_path = work / f"{name}.log"
    t0 = time.perf_counter()
    seen: list[tuple[int, float]] = []  # (step, seconds since launch) of each logged window
    stopped = False

    def poll() -> None:
        rows = metrics.read_text().splitlines() if metrics.exists() else []
        for line in rows[len(seen) :]:
            if line.endswith("}"):  # a whole line
                seen.append((json.loads(line)["step"], time.perf_counter() - t0))

    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "usmkit.cli.train", *overrides], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        while proc.poll() is None:
            poll()
            if time.perf_counter() - t0 > args.variant_timeout:
                proc.kill()
                proc.wait()
                stopped = True
                break
            time.sleep(0.2)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0 and not stopped:
        tail = log_path.read_text()[-600:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    poll()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in rows if "train/frames_per_s" in r]
    result: dict = {"first_log_s": round(seen[0][1], 1) if seen else None, "wall_s": round(wall_s, 1)}
    if stopped:
        result["stopped"] = (
            f"after {args.variant_timeout:.0f} s, at step {train[-1]['step'] if train else 0} of {args.steps}"
        )
    result["seconds_to_step"] = {str(step): round(t, 1) for step, t in seen[:: max(1, len(seen) // 10)]}
    steady = train[len(train) // 3 :]
    if len(steady) >= 3:
        result["frames_per_s"] = round(statistics.median(r["train/frames_per_s"] for r in steady))
        result["windows"] = len(steady)
        result["last_loss"] = round(train[-1]["train/loss"], 4)
    return result


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
    ap.add_argument("--json", default=result_path("trainer_compile"))
    args = ap.parse_args()
    result = run_header(model=args.model, data=args.data, steps=args.steps, variants={})
    with tempfile.TemporaryDirectory(prefix="trainer_compile_") as tmp:
        for name in args.variants.split(","):
            r = run_variant(name, args, Path(tmp))
            result["variants"][name] = r
            print(f"{name:10s} {json.dumps(r)}", flush=True)
            write_result(args.json, result)
    eager = result["variants"].get("eager", {}).get("frames_per_s")
    print(f"\n{'variant':10s} {'first log s':>11s} {'wall s':>7s} {'frames/s':>9s} {'vs eager':>8s}  note")
    for name, r in result["variants"].items():
        if "error" in r:
            print(f"{name:10s} {r['error'][:80]}")
            continue
        fps = r.get("frames_per_s")
        ratio = f"{fps / eager:.2f}x" if (eager and fps) else ""
        first = f"{r['first_log_s']:.1f}" if r["first_log_s"] is not None else "-"
        print(f"{name:10s} {first:>11s} {r['wall_s']:7.1f} {fps or '-':>9} {ratio:>8s}  {r.get('stopped', '')}")


if __name__ == "__main__":
    main()
