"""How close the compiled training step's generated kernels run to the GPU's memory bandwidth.

    PYTHONPATH=. python experiments/inductor_bandwidth/inductor_bandwidth.py [--size large] [--models ours,torchaudio] [--top 20] [--json OUT]

The step is ``bench/train_throughput.py``'s (bf16 autocast, CTC, fused AdamW, each Conformer layer
compiled; ours with the Triton chunk attention). With ``TORCHINDUCTOR_PROFILE=1`` inductor records in
each kernel it generates how many bytes the kernel reads and writes (``kernel_num_gb``) and launches it
through a debugging autotuner, whose ``run`` is replaced here: it launches the kernel as inductor
normally does and, while a step is recorded, notes the kernel's name and bytes. ``torch.profiler``
times the same step's kernels on the GPU. Per kernel name: launches, GB and ms per step. Set against
a device-to-device copy measured in the same process, ``floor_ms`` is the time the step's
generated-kernel bytes would take at the copy's rate. ``tunable_ms`` sums, kernel by kernel, the time
above that rate (a kernel already faster than the copy adds nothing, so fast kernels do not hide slow
ones): the most that tuning those kernels (block sizes, warps) could still win, as far as inductor's
byte counts are right; anything more needs fewer bytes, i.e. different fusion. Kernels faster than
the copy show where those counts include bytes served from cache (re-read or broadcast inputs).
GEMMs, our attention, CTC, AdamW and aten's reductions are not inductor's and are not counted
(``bench/profile_step.py`` has them). Kernels of different graphs (forward, backward) that share a
name are one row.
"""

from __future__ import annotations

import os
import tempfile

# Inductor reads these when it is imported; a fresh cache so no kernel comes back compiled without them.
os.environ["TORCHINDUCTOR_PROFILE"] = "1"
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cache_")

import argparse  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402
import torch._inductor.config  # noqa: E402
from torch._inductor.runtime import triton_heuristics  # noqa: E402

# Under the profile setting inductor would also run each compiled module's benchmark harness at
# compile time, which in torch 2.11 fails (``benchmark_compiled_module() missing ... 'args'``).
torch._inductor.config.benchmark_harness = False

_launches: list | None = None  # (kernel name, GB) while a step is recorded


def _noting_run(self, *args, stream, **kwargs):
    """``DebugAutotuner.run`` replaced: its own version benchmarks each kernel in isolation once (cloning,
    and timing, the buffers it writes in place) and never launches it again. This launches the kernel
    as inductor normally does and, while recording, notes its name and bytes."""
    if _launches is not None:
        _launches.append((self.fn.__name__, self.inductor_meta.get("kernel_num_gb") or 0.0))
    return triton_heuristics.CachingAutotuner.run(self, *args, stream=stream, **kwargs)


triton_heuristics.DebugAutotuner.run = _noting_run

from tools.results import result_path, run_header, write_result  # noqa: E402
from tools.train_step import (  # noqa: E402  (the step of bench/train_throughput.py)
    SHAPES,
    OursCTC,
    TorchaudioCTC,
    bf16_residual,
    compile_regions,
    make_batch,
    make_step,
)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write), median of triton's do_bench."""
    from triton.testing import do_bench

    src = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms / 1e3) / 1e9


def measure(model: torch.nn.Module, batch, copy_gbs: float, steps: int) -> dict:
    """Generated kernels of ``steps`` training steps, per name: launches, GB and GPU ms per step."""
    global _launches
    compile_regions(model, dynamic=False)
    step = make_step(model, batch)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    _launches = []
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    noted, _launches = _launches, None
    gb: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for name, g in noted:
        gb[name] += g / steps
        launches[name] += 1
    ms: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.key in gb:
            ms[ev.key] += ev.device_time_total / steps / 1e3
    missing = sorted(set(gb) - set(ms))
    total_ms = sum(ms.values())
    total_gb = sum(gb[n] for n in ms)
    rows = [
        {
            "kernel": n,
            "launches": launches[n] // steps,
            "ms": round(ms[n], 3),
            "gb": round(gb[n], 4),
            "gb_per_s": round(gb[n] / (ms[n] / 1e3)),
            "of_copy": round(gb[n] / (ms[n] / 1e3) / copy_gbs, 3),
        }
        for n in sorted(ms, key=lambda n: -ms[n])
    ]
    slow = [r for r in rows if r["of_copy"] < 0.5]
    tunable = sum(max(0.0, ms[n] - gb[n] / copy_gbs * 1e3) for n in ms)
    return {
        "steps_recorded": steps,
        "kernels_not_seen_by_the_profiler": missing,
        "kernel_launches_per_step": sum(r["launches"] for r in rows),
        "ms_per_step": round(total_ms, 2),
        "gb_per_step": round(total_gb, 2),
        "gb_per_s": round(total_gb / (total_ms / 1e3)),
        "floor_ms": round(total_gb / copy_gbs * 1e3, 2),
        "tunable_ms": round(tunable, 2),
        "below_half_of_copy": {"kernels": len(slow), "ms": round(sum(r["ms"] for r in slow), 2)},
        "kernels": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="large")
    ap.add_argument("--models", default="ours,torchaudio", help="ours, torchaudio, ours_bf16res (bf16 residual stream)")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3, help="steps recorded (averaged)")
    ap.add_argument("--json", default=result_path(__file__))
    args = ap.parse_args()
    copy_gbs = copy_bandwidth()
    B, T = SHAPES[args.size]
    batch = make_batch(B, T, "cuda")
    result = run_header(size=args.size, B=B, T=T, copy_gb_per_s=round(copy_gbs), models={})
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s")
    for name in args.models.split(","):
        torch.manual_seed(0)
        torch._dynamo.reset()
        model = (TorchaudioCTC(args.size) if name == "torchaudio" else OursCTC(args.size, "triton", args.chunk)).cuda()
        if name == "ours_bf16res":
            bf16_residual(model)
        r = measure(model, batch, copy_gbs, args.steps)
        result["models"][name] = r
        del model
        torch.cuda.empty_cache()
        print(
            f"\n{name}: {r['kernel_launches_per_step']} generated-kernel launches per step; {r['ms_per_step']:.2f} ms, {r['gb_per_step']:.1f} GB ({r['gb_per_s']} GB/s); at the copy "
            f"rate {r['floor_ms']:.2f} ms; kernels under half the copy rate: {r['below_half_of_copy']['kernels']} "
            f"({r['below_half_of_copy']['ms']:.2f} ms)"
        )
        print(f"{'ms/step':>8s} {'launches':>8s} {'GB/step':>8s} {'GB/s':>6s} {'of copy':>7s}  kernel")
        for k in r["kernels"][: args.top]:
            print(
                f"{k['ms']:8.3f} {k['launches']:8d} {k['gb']:8.3f} {k['gb_per_s']:6d} "
                f"{k['of_copy']:7.2f}  {k['kernel'][:90]}"
            )
        write_result(args.json, result)
    print(f"\n{'model':12s} {'ms/step':>8s} {'GB/step':>8s} {'floor ms':>8s} {'tunable ms':>10s}")
    for name, r in result["models"].items():
        print(
            f"{name:12s} {r['ms_per_step']:8.2f} {r['gb_per_step']:8.1f} {r['floor_ms']:8.2f} {r['tunable_ms']:10.2f}"
        )


if __name__ == "__main__":
    main()
