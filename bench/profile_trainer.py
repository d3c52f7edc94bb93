"""Where the real trainer's GPU time goes per second of audio, by kernel category, for several batch layouts.

    PYTHONPATH=. python bench/profile_trainer.py [--variants usm600m_fb,usm600m_pk_tri] [--manifest-dir data/synth]
        [--warm 40] [--steps 8] [--num-workers 10] [--json OUT]

``bench/profile_step.py`` profiles one synthetic step of full rows; this profiles the actual training command
of ``bench/trainer_throughput.py`` (same variant names, same corpus, bucketed or packed batches) so the cost
of what a layout adds (padding, packed masks, unpacking for CTC) shows up. Each variant runs in its own
process: ``python -m usmkit.cli.train`` with the trainer's forward-backward wrapped so that, after ``--warm``
steps (compilation done), ``torch.profiler`` records ``--steps`` whole steps (forward, backward, optimizer).
CUDA graphs hide kernels from the profiler, so ``_cg`` is profiled as ``_fb`` (the same kernels, replayed).

Per variant: GPU kernel ms per step and per second of valid audio (the batches' real frames), by category
(``profile_step.category``), the top kernels and the host ops that launched the most GPU time. The table
compares the variants' ms per audio second, category by category.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_throughput import HOP_S, ROOT, _env, command, ensure_corpus, parse_variant  # noqa: E402

from tools.results import result_path, run_header, write_result  # noqa: E402


def child(out: Path, warm: int, steps: int, overrides: list[str]) -> None:
    """Train with ``overrides`` for ``warm + steps + 1`` steps, profiling steps [warm, warm + steps)."""
    import torch
    from profile_step import kernel_summary

    from usmkit.cli.train import main as train_main
    from usmkit.training.trainer import Trainer

    original = Trainer._forward_backward
    device_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    state: dict = {"n": 0, "frames": 0, "prof": None}

    def finish() -> None:
        device_sync()
        wall_ms = (time.perf_counter() - state["t0"]) * 1e3 / steps
        state["prof"].__exit__(None, None, None)
        summary = kernel_summary(state["prof"], steps, 30)
        result = {
            "wall_ms_per_step": round(wall_ms, 2),
            "kernel_ms_per_step": summary["kernel_ms_per_step"],
            "audio_s_per_step": round(state["frames"] * HOP_S / steps, 2),  # valid audio per step
            "categories_ms_per_step": summary["categories_ms"],
            "top_kernels": summary["top_kernels"],
            "top_host_ops": summary["top_host_ops"],
        }
        out.write_text(json.dumps(result, indent=1))

    def forward_backward(self, batch, sync):
        n = state["n"]
        state["n"] += 1
        if n == warm:
            device_sync()
            state["prof"] = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            state["prof"].__enter__()
            state["t0"] = time.perf_counter()
        elif n == warm + steps:  # the profiled steps' optimizer updates are done
            finish()
        result = original(self, batch, sync)
        if warm <= n < warm + steps:
            state["frames"] += result[1]
        return result

    Trainer._forward_backward = forward_backward
    train_main([*overrides, f"trainer.max_steps={warm + steps + 1}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="usm600m_fb,usm600m_pk_tri")
    ap.add_argument("--manifest-dir", default="data/synth")
    ap.add_argument("--warm", type=int, default=40, help="steps before profiling (every padded length compiled)")
    ap.add_argument("--steps", type=int, default=8, help="steps profiled")
    ap.add_argument("--num-workers", type=int, default=10)
    ap.add_argument("--max-duration", type=float, default=0, help="data.max_duration (0: the size's default)")
    ap.add_argument("--json", default=result_path("profile_trainer"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, model=tiny: checks the plumbing")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(args.child, args.warm, args.steps, rest)
    args.synth_workers = 16
    if args.dry_run:
        args.variants = "tiny_fb,tiny_pk"
    ensure_corpus(args)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="profile_trainer_") as tmp:
        for name in args.variants.split(","):
            if parse_variant(name).cuda_graphs:
                raise SystemExit(f"{name}: CUDA graphs hide kernels from the profiler; profile its _fb twin")
            cmd = command(name, args, Path(tmp) / name)
            overrides = [o for o in cmd[cmd.index("usmkit.cli.train") + 1 :] if not o.startswith("trainer.max_steps=")]
            out = Path(tmp) / f"{name}.json"
            child_cmd = [sys.executable, __file__, "--child", str(out), "--warm", str(args.warm),
                         "--steps", str(args.steps), *overrides]  # fmt: skip
            t0 = time.time()
            env = _env(TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / f"inductor_{name}"))
            proc = subprocess.run(child_cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                results[name] = {"error": f"exit {proc.returncode}: {proc.stderr[-800:]}"}
                print(f"{name}: failed\n{proc.stderr[-2000:]}", flush=True)
                continue
            results[name] = {"command": "python -m usmkit.cli.train " + " ".join(overrides)} | json.loads(
                out.read_text()
            )
            print(f"{name}: profiled in {time.time() - t0:.0f} s", flush=True)
    done = {n: r for n, r in results.items() if "error" not in r}
    cats = sorted({c for r in done.values() for c in r["categories_ms_per_step"]})
    print(f"\nGPU kernel ms per second of valid audio\n{'category':16s}" + "".join(f"{n:>18s}" for n in done))
    for row in [*cats, "kernels", "wall"]:
        cells = []
        for r in done.values():
            ms = {"kernels": r["kernel_ms_per_step"], "wall": r["wall_ms_per_step"]}.get(
                row, r["categories_ms_per_step"].get(row, 0.0)
            )
            cells.append(f"{ms / r['audio_s_per_step']:18.3f}")
        print(f"{row:16s}" + "".join(cells))
    print(f"{'audio s / step':16s}" + "".join(f"{r['audio_s_per_step']:18.1f}" for r in done.values()))
    path = write_result(args.json, run_header(manifest_dir=args.manifest_dir, warm=args.warm, steps=args.steps) | {
        "variants": results})  # fmt: skip
    print(f"JSON: {path}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
