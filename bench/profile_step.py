"""Where a compiled training step's GPU time goes, by kernel category, and what the convolution module costs.

    PYTHONPATH=. python bench/profile_step.py [--size large] [--impl triton] [--conv-impls torch,triton] [--top 20]
        [--no-side-by-side] [--json OUT]
    PYTHONPATH=. python bench/profile_step.py trainer [--variants usm600m_fb,usm600m_pk_tri] [--manifest-dir data/synth]
        [--warm 40] [--steps 8] [--num-workers 10] [--dry-run] [--json OUT]

Same step as ``bench/train_throughput.py`` (bf16 autocast, CTC loss, fused AdamW, regional compile,
static shapes). ``torch.profiler`` records 3 steps; CUDA kernel time is summed per category (matmul,
attention, convolution, inductor-fused elementwise/norm, optimizer, CTC, other) and the top kernels
are listed, once per ``--conv-impls`` (``model.conv_impl``: ``torch``, the module as PyTorch operations that
inductor fuses, and ``triton``, its middle as the fused kernel of ``usmkit.kernels.conv_module``), each under
``profiles[conv_impl]`` (the first also at the top level). Then the steps are timed side by side in one run,
alternated: each conv impl, torchaudio's Conformer of equal size, and with ``--cudnn-dw`` the depthwise
convolution forced through cuDNN's grouped ``nn.Conv1d`` (``dw=conv``) instead of the K shifted multiply-adds
inductor fuses (``dw=shifted``).

``trainer``: the same categories over steps of the actual training command (see ``TRAINER_DOC``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools.results import result_path, run_header, write_result  # noqa: E402
from tools.train_step import (  # noqa: E402
    SHAPES,
    OursCTC,
    TorchaudioCTC,
    compile_regions,
    make_batch,
    make_step,
    timed,
)
from usmkit.models.convolution import ConvolutionModule  # noqa: E402

TRAINER_DOC = """Where the real trainer's GPU time goes per second of audio, by kernel category, for several batch layouts.

The synthetic step above is one step of full rows; this profiles the actual training command of
``bench/trainer_throughput.py`` (same variant names, same corpus, bucketed or packed batches) so the cost of
what a layout adds (padding, packed masks, unpacking for CTC) shows up. Each variant runs in its own process:
``python -m usmkit.cli.train`` with the trainer's forward-backward wrapped so that, after ``--warm`` steps
(compilation done), ``torch.profiler`` records ``--steps`` whole steps (forward, backward, optimizer). CUDA
graphs hide kernels from the profiler, so ``_cg`` is profiled as ``_fb`` (the same kernels, replayed).

Per variant: GPU kernel ms per step and per second of valid audio (the batches' real frames), by category
(``category``), the top kernels and the host ops that launched the most GPU time. The table compares the
variants' ms per audio second, category by category.
"""

HOP_S = 0.01  # feature frame shift of the corpus (data.features.frame_shift_ms=10)
CATEGORIES = [  # first match wins
    ("attention", r"chunk_attn|_attn_|flash|fmha|attention|sdpa"),
    ("matmul", r"gemm|cutlass|nvjet|sm90_xmma|matmul|cublas|s16816|s1688"),
    ("convolution", r"conv|cudnn|dgrad|wgrad|implicit|depthwise"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("ctc", r"ctc"),
    ("inductor fused", r"^triton_"),
]


def category(name: str, categories: list[tuple[str, str]] = CATEGORIES) -> str:
    """The first of ``categories`` (name, regex) whose pattern the kernel ``name`` matches, else "other"."""
    for cat, pattern in categories:
        if re.search(pattern, name, re.IGNORECASE):
            return cat
    return "other"


def cudnn_depthwise(self: ConvolutionModule, y: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
    """``ConvolutionModule.depthwise`` of a whole sequence through ``nn.Conv1d`` even when compiling."""
    assert context is None, "training steps convolve whole sequences"
    y = F.pad(y.transpose(1, 2), (self.left_context, self.kernel_size - 1 - self.left_context))  # (B, D, T + K - 1)
    return self.depthwise_conv(y).transpose(1, 2)  # (B, T, D)


def build(size: str, impl: str, chunk: int, dw: str, conv_impl: str = "torch"):
    torch.manual_seed(0)
    model = TorchaudioCTC(size) if impl == "torchaudio" else OursCTC(size, impl, chunk, conv_impl)
    if dw == "conv":  # per instance, so models built earlier keep their own convolution
        for m in model.modules():
            if isinstance(m, ConvolutionModule):
                m.depthwise = types.MethodType(cudnn_depthwise, m)
    model = model.cuda()
    compile_regions(model, dynamic=False)
    return model


def kernel_summary(prof: torch.profiler.profile, steps: int, top: int) -> dict:
    """GPU time of a profile over ``steps`` steps, per step: total kernel ms, ms per category, the ``top``
    costliest kernels, and the ``top`` host ops that launched the most GPU time of their own."""
    per_kernel: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        # GPU-side ranges of record_function annotations ("Optimizer.step#AdamW.step") span kernels
        # already counted on their own: skip them.
        if ev.is_user_annotation:
            continue
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            per_kernel[ev.key] += ev.device_time_total / steps / 1e3  # ms per step
    ops = [  # the host ops that launched the GPU time (aten ops outside inductor's kernels, custom ops)
        (ev.key, ev.count / steps, ev.self_device_time_total / steps / 1e3)
        for ev in prof.key_averages()
        if ev.device_type == torch.autograd.DeviceType.CPU and ev.self_device_time_total > 0
    ]
    ops.sort(key=lambda o: -o[2])
    per_cat: dict[str, float] = defaultdict(float)
    for name, ms in per_kernel.items():
        per_cat[category(name)] += ms
    costliest = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]
    return {
        "kernel_ms_per_step": round(sum(per_cat.values()), 2),
        "categories_ms": {k: round(v, 2) for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "ms": round(ms, 3), "category": category(n)} for n, ms in costliest],
        "top_host_ops": [{"op": k[:120], "calls": c, "ms": round(ms, 3)} for k, c, ms in ops[:top]],
    }


def profile_once(args, batch, conv_impl: str) -> dict:
    """Part 1 for one conv impl: step time, GPU time per kernel category, top kernels and host ops."""
    result: dict = {}
    model = build(args.size, args.impl, args.chunk, "shifted", conv_impl)  # the default compiled step
    step = make_step(model, batch)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    result["step_ms"] = statistics.median(timed(step, args.steps))
    activities = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    result |= kernel_summary(prof, 3, args.top)
    total = result["kernel_ms_per_step"]
    print(
        f"\n{args.size} {args.impl} conv={conv_impl}: step {result['step_ms']:.1f} ms, kernels {total:.1f} ms per step"
    )
    print(f"{'category':16s} {'ms/step':>8s} {'share':>6s}")
    for cat, ms in result["categories_ms"].items():
        print(f"{cat:16s} {ms:8.2f} {100 * ms / total:5.1f}%")
    print("\ntop kernels:")
    for k in result["top_kernels"]:
        print(f"{k['ms']:8.3f} ms  {k['category']:14s} {k['name'][:110]}")
    print("\ntop host ops by the GPU time of their own kernels:")
    for o in result["top_host_ops"]:
        print(f"{o['ms']:8.3f} ms  {o['calls']:6.0f} calls/step  {o['op']}")
    del model, step
    torch.cuda.empty_cache()
    return result


def child(out: Path, warm: int, steps: int, overrides: list[str]) -> None:
    """Train with ``overrides`` for ``warm + steps + 1`` steps, profiling steps [warm, warm + steps)."""
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


def trainer_main(argv: list[str]) -> None:
    """``profile_step.py trainer ...``: the real trainer's kernels per second of audio, per batch layout."""
    from trainer_throughput import ROOT, _env, command, ensure_corpus, parse_variant

    ap = argparse.ArgumentParser(prog="profile_step.py trainer", description=TRAINER_DOC)
    ap.add_argument("--variants", default="usm600m_fb,usm600m_pk_tri")
    ap.add_argument("--manifest-dir", default="data/synth")
    ap.add_argument("--warm", type=int, default=40, help="steps before profiling (every padded length compiled)")
    ap.add_argument("--steps", type=int, default=8, help="steps profiled")
    ap.add_argument("--num-workers", type=int, default=10)
    ap.add_argument("--max-duration", type=float, default=0, help="data.max_duration (0: the size's default)")
    ap.add_argument("--json", default=result_path("profile_step", "trainer"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, model=tiny: checks the plumbing")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.child:
        return child(args.child, args.warm, args.steps, rest)
    args.synth_workers = 16
    if args.dry_run:
        args.variants = "tiny_fb,tiny_pk"
    ensure_corpus(args)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="profile_step_trainer_") as tmp:
        for name in args.variants.split(","):
            if parse_variant(name).cuda_graphs:
                raise SystemExit(f"{name}: CUDA graphs hide kernels from the profiler; profile its _fb twin")
            cmd = command(name, args, Path(tmp) / name)
            overrides = [o for o in cmd[cmd.index("usmkit.cli.train") + 1 :] if not o.startswith("trainer.max_steps=")]
            out = Path(tmp) / f"{name}.json"
            child_cmd = [sys.executable, __file__, "trainer", "--child", str(out), "--warm", str(args.warm),
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


def main() -> None:
    if sys.argv[1:2] == ["trainer"]:
        return trainer_main(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="large")
    ap.add_argument("--impl", default="triton")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=20, help="how many of the costliest kernels to list")
    ap.add_argument("--conv-impls", default="torch,triton", help="model.conv_impl values to profile and time")
    ap.add_argument("--cudnn-dw", action="store_true", help="also time the depthwise conv through cuDNN")
    ap.add_argument("--no-side-by-side", action="store_true", help="profile only (skip part 2)")
    ap.add_argument("--json", default=result_path("profile_step"))
    args = ap.parse_args()
    B, T = SHAPES[args.size]
    batch = make_batch(B, T, "cuda")
    result = run_header(size=args.size, B=B, T=T, impl=args.impl)

    # 1. Profile of our compiled step (default depthwise), once per conv impl.
    for conv_impl in args.conv_impls.split(","):
        profile = profile_once(args, batch, conv_impl)
        result.setdefault("profiles", {})[conv_impl] = profile
        if len(result["profiles"]) == 1:
            result |= profile
    if args.no_side_by_side:
        write_result(args.json, result)
        return

    # 2. Side by side: each conv impl, the depthwise convolution through cuDNN, torchaudio; alternated.
    variants = {f"ours conv={c}": (args.impl, "shifted", c) for c in args.conv_impls.split(",")}
    if args.cudnn_dw:
        variants["ours dw=conv"] = (args.impl, "conv", "torch")
    variants["torchaudio"] = ("torchaudio", "conv", "torch")
    steps = {}
    for name, (impl, dw, conv_impl) in variants.items():
        m = build(args.size, impl, args.chunk, dw, conv_impl)
        steps[name] = (m, make_step(m, batch))
        for _ in range(3):
            steps[name][1]()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3):  # rounds, alternating the variants against drift
        for name, (_, st) in steps.items():
            times[name].append(statistics.median(timed(st, args.steps)))
    result["step_ms_side_by_side"] = {n: round(statistics.median(t), 2) for n, t in times.items()}
    ta = result["step_ms_side_by_side"]["torchaudio"]
    print(f"\n{'variant':18s} {'ms/step':>8s} {'vs torchaudio':>13s}")
    for n, ms in result["step_ms_side_by_side"].items():
        print(f"{n:18s} {ms:8.2f} {ta / ms:12.2f}x")
    write_result(args.json, result)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
