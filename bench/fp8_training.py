"""FP8 training through torchao's float8 against bf16, on the GPU: what it gains on the linears alone,
what it gains on the whole training step, and where the difference goes.

    PYTHONPATH=. python bench/fp8_training.py [--sizes large,usm2b] [--steps 12] [--variants ...] [--json OUT]

Needs torchao (``pip install torchao``; not a dependency of usmkit) and a GPU with FP8 matmuls (H100/H200).

1. **The linears alone.** For each linear of a Conformer block of SIZE (FF up D->4D and down 4D->D,
   attention QKV D->3D and out D->D, the conv module's pointwise D->2D and D->D), forward + backward of
   one ``nn.Linear`` on the step's M = B x T frames, bf16 autocast against ``convert_to_float8_training``
   with the ``tensorwise`` and ``rowwise`` recipes, each compiled on its own (``torch.compile`` fuses
   torchao's scale (amax) and cast kernels). This is the most FP8 can give: matmuls only.
2. **The training step** of ``bench/train_throughput.py`` (our Conformer with the Triton chunk
   attention, CTC head, fused AdamW, bf16 autocast), the same B x T, with its linears converted or not.
   Variants ``COMPILE[_RECIPE]``: ``blocks`` (each block compiled on its own, as ``trainer.compile=true``),
   ``whole`` (the whole model in one graph, so casts can fuse into the LayerNorms and activations
   around the linears), ``blocks_cg`` (blocks replayed as CUDA graphs: no launch gaps); recipe suffix
   ``_fp8`` (tensorwise) or ``_fp8row`` (rowwise), none = bf16.
3. **Where the time goes**: for the ``blocks`` and ``blocks_fp8`` steps of the first size, GPU kernel time
   by category from ``torch.profiler`` (matmul, FP8 scale/cast, other fused elementwise, attention, ...).

Prints a table per part, writes ``bench/results/fp8_training.json`` (``$OUT/fp8_training.json`` on the lent GPUs).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch._dynamo
from common import result_path, run_header, write_result
from profile_step import category
from train_throughput import SHAPES, OursCTC, make_batch, make_step, measure_peak, timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.models.presets import preset  # noqa: E402

STEP_SHAPES = SHAPES | {"usm600m": (16, 768), "usm2b": (8, 768)}  # (B, T encoder frames)
RECIPES = {"": None, "_fp8": "tensorwise", "_fp8row": "rowwise"}
CATEGORIES = [  # kernel name -> category, first match wins
    ("fp8 matmul", r"f8|fp8|e4m3|scaled_mm"),
    ("matmul", r"gemm|cutlass|nvjet|sm90_xmma|matmul|cublas|s16816|s1688"),
    ("attention", r"chunk_attn|_attn_|flash|fmha|attention|sdpa"),
    ("convolution", r"conv|cudnn|dgrad|wgrad|implicit|depthwise"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("reductions (LayerNorm, softmax, FP8 amax)", r"^triton_(red|per)_"),
    ("fused elementwise (incl. casts)", r"^triton_poi_"),
]


def to_float8(model: torch.nn.Module, recipe: str) -> int:
    """Convert every linear whose dimensions FP8 matmuls take (multiples of 16) in place; returns how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(mod: torch.nn.Module, fqn: str) -> bool:
        return isinstance(mod, torch.nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=eligible)
    return before - sum(type(m) is torch.nn.Linear for m in model.modules())


def linear_shapes(size: str) -> dict[str, tuple[int, int]]:
    D = preset(size).d_model
    return {"ff_up": (D, 4 * D), "ff_down": (4 * D, D), "qkv": (D, 3 * D), "attn_out": (D, D),
            "pointwise1": (D, 2 * D), "pointwise2": (D, D)}  # fmt: skip


def time_linear(d_in: int, d_out: int, M: int, recipe: str | None, steps: int, device) -> float:
    """Median ms of forward + backward of one compiled linear on (M, d_in) bf16-autocast inputs."""
    torch._dynamo.reset()
    lin = torch.nn.Sequential(torch.nn.Linear(d_in, d_out)).to(device)
    if recipe:
        to_float8(lin, recipe)
    lin.compile()
    x = torch.randn(M, d_in, device=device, requires_grad=True)
    grad = torch.randn(M, d_out, device=device, dtype=torch.bfloat16)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = lin(x)
        y.backward(grad)

    for _ in range(3):
        step()
    return statistics.median(timed(step, steps))


def kernel_breakdown(step, steps: int = 5) -> dict[str, float]:
    """GPU ms per step by kernel category (``torch.profiler``, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if t > 0:
            totals[category(evt.key, CATEGORIES)] += t / 1e3 / steps
    return {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def step_variant(size: str, variant: str, steps: int, device, profile_it: bool) -> dict:
    compile_kind, recipe_suffix = re.fullmatch(r"(blocks|whole|blocks_cg)(_fp8row|_fp8)?", variant).groups()
    recipe = RECIPES[recipe_suffix or ""]
    torch.manual_seed(0)
    torch._dynamo.reset()
    torch.cuda.reset_peak_memory_stats()
    model = OursCTC(size, "triton", 128).to(device)
    converted = to_float8(model, recipe) if recipe else 0
    mode = "reduce-overhead" if compile_kind == "blocks_cg" else None
    if compile_kind == "whole":
        model.compile()
    else:
        for region in [model.encoder.subsampling, *model.encoder.blocks, model.head]:
            region.compile(mode=mode)
    B, T = STEP_SHAPES[size]
    step = make_step(model, make_batch(B, T, device))
    for _ in range(3):
        loss = step()
    torch.cuda.synchronize()
    times = timed(step, steps)
    r = {
        "step_ms": round(statistics.median(times), 2),
        "step_ms_min": round(min(times), 2),
        "linears_fp8": converted,
        "loss_finite": bool(torch.isfinite(loss).item()),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
    }
    if profile_it:
        r["kernel_ms_per_step"] = kernel_breakdown(step)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="large,usm2b")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants", default="blocks,blocks_fp8,blocks_fp8row,whole,whole_fp8,blocks_cg,blocks_cg_fp8")
    ap.add_argument("--no-linears", action="store_true", help="skip part 1")
    ap.add_argument("--json", default=result_path("fp8_training"))
    args = ap.parse_args()
    device = torch.device("cuda")
    result = run_header(measured_bf16_matmul_tflops=round(measure_peak(device) / 1e12, 1), linears={}, steps={})
    sizes = args.sizes.split(",")

    if not args.no_linears:
        print(
            f"{'size':8s} {'linear':11s} {'M':>6s} {'bf16 ms':>8s} {'fp8 ms':>8s} {'x':>5s} {'fp8row ms':>9s} {'x':>5s}"
        )
        for size in sizes:
            B, T = STEP_SHAPES[size]
            rows = {}
            for name, (d_in, d_out) in linear_shapes(size).items():
                ms = {k or "bf16": time_linear(d_in, d_out, B * T, r, args.steps, device) for k, r in RECIPES.items()}
                rows[name] = {
                    "d_in": d_in,
                    "d_out": d_out,
                    "M": B * T,
                    **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                }
                print(f"{size:8s} {name:11s} {B * T:6d} {ms['bf16']:8.3f} {ms['_fp8']:8.3f} {ms['bf16'] / ms['_fp8']:5.2f} "
                      f"{ms['_fp8row']:9.3f} {ms['bf16'] / ms['_fp8row']:5.2f}", flush=True)  # fmt: skip
            total = {k: sum(r[f"{k}_ms"] for r in rows.values()) for k in ("bf16", "_fp8", "_fp8row")}
            result["linears"][size] = {
                "rows": rows,
                "block_linears_ms": {k: round(v, 3) for k, v in total.items()},
                "speedup_tensorwise": round(total["bf16"] / total["_fp8"], 2),
                "speedup_rowwise": round(total["bf16"] / total["_fp8row"], 2),
            }
            write_result(args.json, result)

    for i, size in enumerate(sizes):
        result["steps"][size] = {"B": STEP_SHAPES[size][0], "T": STEP_SHAPES[size][1], "variants": {}}
        for v in args.variants.split(","):
            try:
                r = step_variant(size, v, args.steps, device, profile_it=i == 0 and v in ("blocks", "blocks_fp8"))
            except Exception as e:  # record and go on: one failing variant must not lose the others
                r = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            result["steps"][size]["variants"][v] = r
            torch.cuda.empty_cache()
            print(f"{size:8s} {v:15s} {json.dumps(r)}", flush=True)
            write_result(args.json, result)
        ok = result["steps"][size]["variants"]
        for v, r in ok.items():
            base = ok.get(v.replace("_fp8row", "").replace("_fp8", ""), {})
            if "_fp8" in v and "step_ms" in r and "step_ms" in base:
                r["speedup_vs_bf16_same_compile"] = round(base["step_ms"] / r["step_ms"], 3)
        write_result(args.json, result)

    print(f"\n{'size':8s} {'variant':15s} {'ms/step':>9s} {'vs bf16':>8s} {'peak GiB':>9s}")
    for size, entry in result["steps"].items():
        for v, r in entry["variants"].items():
            if "step_ms" in r:
                print(f"{size:8s} {v:15s} {r['step_ms']:9.1f} {r.get('speedup_vs_bf16_same_compile', 1.0):8.2f} "
                      f"{r['peak_mem_gib']:9.1f}")  # fmt: skip
            else:
                print(f"{size:8s} {v:15s} {r['error'][:70]}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
