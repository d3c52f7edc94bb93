"""Training-step throughput on the GPU: eager vs compiled vs compiled + Triton attention, against
torchaudio's Conformer of the same width and depth (same conv front end and CTC head, compiled).

    PYTHONPATH=. python bench/train_throughput.py [--sizes base,large] [--steps 12] [--repeats 3] [--json OUT]
    PYTHONPATH=. python bench/train_throughput.py --device cpu --sizes tiny --variants eager,ta_eager --steps 2
    PYTHONPATH=. python bench/train_throughput.py --sizes w2v_bert_2,usm600m --variants eager,static,static_cg

Each variant runs ``--repeats`` times in the call (``tools.repeats``): built again, compiled again, ``--steps``
steps timed; ``step_ms`` and the figures from it are the median over the repeats, with min and max under
``repeats``. ``--device cpu`` (fp32, no autocast) only checks the plumbing.

One step = forward, CTC loss, backward and a fused AdamW update, bf16 autocast with fp32 weights.
Frames are encoder frames (40 ms; 20 ms for ``w2v_bert_2``); audio h/GPU-h counts the batch's audio (10 ms
feature frames). ``w2v_bert_2`` is the imported w2v-BERT 2.0 encoder's size (random weights: the same cost)
fine-tuned with a CTC head, at the same 300 s of audio per batch as ``usm600m``: the two sizes side by side
answer what fine-tuning an import costs against usmkit's own 600M encoder (torchaudio has no model of its
layout: its ``ta_`` variants fail for it and are recorded as such). MFU = 6 x parameters x frames / step time / peak, with the peak
both the datasheet's dense bf16 rate (989 TFLOP/s, H100/H200 SXM) and a bf16 matmul measured here.
``static`` compiles for one fixed shape (what bucketed padding to a few lengths gives: one compile
per bucket); ``dynamic`` compiles once with symbolic batch and time (``dynamic=True``). A ``_ma``
suffix (``static_ma``, ``triton_ma``, ``ta_static_ma``) compiles with inductor's max-autotune
(``max-autotune-no-cudagraphs``: Triton matmul templates, benchmarked, with fused epilogues).
A ``_cg`` suffix (``static_cg``, ``triton_cg``, ``ta_static_cg``) compiles with ``mode="reduce-overhead"``:
each compiled region's forward and backward replay as CUDA graphs, which removes the host time
between kernels (launches, autograd, custom-op dispatch) where the GPU would otherwise wait.
Compilation is regional, for both models: the front end and each Conformer layer are compiled
(identical layers share one compiled graph), the CTC loss and glue stay eager. A ``whole_`` prefix
(``whole_static``, ``whole_triton``, ``ta_whole_static``) compiles the whole model instead, as
``trainer.compile_scope=whole`` does (~2 min per variant to compile).
A ``_cdt`` suffix turns on inductor's coordinate-descent tuning of its generated (elementwise and
reduction) kernels' block sizes, for that variant only (at ``large`` on an H100 it had not finished
compiling after 4.5 minutes).
Three suffixes set inductor options (any variant, either model), each for that variant only:
``_pdl`` (``triton.enable_pdl``: programmatic dependent launch, Hopper's overlap of a kernel's start
with the previous kernel's end), ``_nomix`` (``triton.mix_order_reduction`` off: LayerNorm backward
then reduces its weight gradients in kernels of their own instead of partial sums in a workspace
that an eager ``aten::sum`` finishes, 12-13 per block at ``large``) and ``_mixtune``
(``triton.mix_order_reduction_autotune_split_size``: inductor benchmarks the workspace's split).
A ``_bf16res`` suffix (ours only) casts each Conformer block's output to bf16, so the residual
stream between and inside blocks is bf16 instead of the fp32 that autocast's LayerNorm gives: a
measurement of what fp32 activations cost, not a setting of the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._inductor.config

from tools.repeats import add_repeats_argument, repeat
from tools.results import result_path, run_header, write_result
from tools.train_step import (  # the step, shared with ddp_scaling.py, profile_step.py and experiments/
    DATASHEET_BF16,
    FEATURE_S,
    SHAPES,
    OursCTC,
    TorchaudioCTC,
    bf16_residual,
    compile_regions,
    make_batch,
    make_step,
    measure_peak,
    timed,
)

VARIED = (
    "each repeat builds the model again (seed 0) and compiles it again after a dynamo reset (inductor's caches "
    "warm after the first); the same batch"
)


def inductor_options(variant: str) -> dict:
    """The inductor config a variant's suffixes ask for (see the module docstring)."""
    options: dict = {"coordinate_descent_tuning": "_cdt" in variant}
    if "_pdl" in variant:
        options["triton.enable_pdl"] = True
    if "_nomix" in variant:
        options["triton.mix_order_reduction"] = False
    if "_mixtune" in variant:
        options["triton.mix_order_reduction_autotune_split_size"] = True
    return options


def time_steps(model, batch, steps: int, compile_mode: str | None) -> dict:
    if compile_mode is not None:
        mode = None
        if "_ma" in compile_mode:  # inductor's max-autotune: Triton matmul templates with fused epilogues
            mode = "max-autotune-no-cudagraphs"
        elif "_cg" in compile_mode:  # CUDA graphs per compiled region
            mode = "reduce-overhead"
        compile_regions(
            model,
            dynamic=compile_mode.startswith("dynamic"),
            mode=mode,
            whole=compile_mode.startswith("whole"),
        )
    step = make_step(model, batch)
    t0 = time.perf_counter()
    # Inductor compiles at the first call, so its config must hold during the warm-up.
    with torch._inductor.config.patch(inductor_options(compile_mode or "")):
        for _ in range(3):
            loss = step()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    times = timed(step, steps)
    return {
        "step_ms": statistics.median(times),
        "step_ms_min": min(times),
        "warmup_s": round(warmup_s, 1),
        "loss_finite": bool(torch.isfinite(loss).item()),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
    }


def measure_variant(v: str, size: str, batch, args, peak: float | None) -> dict:
    """One repeat of variant ``v`` at ``size``: build, compile, warm up, time ``args.steps`` steps."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    model = None
    try:
        if v.startswith("ta_"):
            model = TorchaudioCTC(size).to(batch[0].device)
            mode = v[3:] if v != "ta_eager" else None
        else:
            impl = "triton" if "triton" in v else "sdpa"
            model = OursCTC(size, impl, args.chunk).to(batch[0].device)
            mode = None if v == "eager" else v.replace("triton", "static")
            if v.endswith("_bf16res"):
                bf16_residual(model)
        params = sum(p.numel() for p in model.parameters())
        r = time_steps(model, batch, args.steps, mode)
        frames = batch[0].shape[0] * SHAPES[size][1]
        r["params_M"] = round(params / 1e6, 1)
        r["frames_per_s"] = round(frames / (r["step_ms"] / 1e3))
        r["audio_h_per_gpu_h"] = round(batch[0].shape[0] * batch[0].shape[1] * FEATURE_S / (r["step_ms"] / 1e3), 1)
        flops = 6 * params * frames
        r["mfu_datasheet"] = round(flops / (r["step_ms"] / 1e3) / DATASHEET_BF16, 3)
        r["mfu_measured_peak"] = round(flops / (r["step_ms"] / 1e3) / peak, 3) if peak else None
    except Exception as e:  # record and go on: one failing variant must not lose the others
        r = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="base,large")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--chunk", type=int, default=128, help="encoder-frame chunk of our model (left_chunks=0)")
    ap.add_argument("--variants", default="eager,static,dynamic,triton,ta_eager,ta_static")
    ap.add_argument("--json", default=result_path("train_throughput"))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the plumbing (fp32, --sizes tiny)")
    add_repeats_argument(ap)
    args = ap.parse_args()
    device = torch.device(args.device)
    peak = measure_peak(device) if device.type == "cuda" else None
    result = run_header(
        measured_bf16_matmul_tflops=round(peak / 1e12, 1) if peak else None,
        chunk_size=args.chunk,
        repeats=args.repeats,
        sizes={},
    )
    variants = args.variants.split(",")
    for size in args.sizes.split(","):
        B, T = SHAPES[size]
        batch = make_batch(B, T, device, size=size)
        entry = {"B": B, "T": T, "frames_per_step": B * T, "variants": {}}
        result["sizes"][size] = entry
        for v in variants:
            r = repeat(lambda i, v=v, size=size, b=batch: measure_variant(v, size, b, args, peak), args.repeats, VARIED)
            entry["variants"][v] = r
            print(f"{size:6s} {v:10s} {json.dumps({k: x for k, x in r.items() if k != 'repeats'})}", flush=True)
            write_result(args.json, result)
        ok = entry["variants"]
        ours = [  # _bf16res changes the numerics, so it is reported but not counted as ours
            (r["step_ms"], v)
            for v, r in ok.items()
            if not v.startswith("ta_") and v != "eager" and not v.endswith("_bf16res") and "step_ms" in r
        ]
        theirs = [
            (r["step_ms"], v) for v, r in ok.items() if v.startswith("ta_") and v != "ta_eager" and "step_ms" in r
        ]
        if ours and theirs:
            entry["best_ours"], entry["best_torchaudio_compiled"] = min(ours)[1], min(theirs)[1]
            entry["speedup_vs_torchaudio_compiled"] = round(min(theirs)[0] / min(ours)[0], 2)
    write_result(args.json, result)
    print(
        f"\n{'size':6s} {'variant':10s} {'ms/step':>9s} {'min-max':>13s} {'frames/s':>10s} {'MFU(989)':>9s} {'MFU(meas)':>9s}"
    )
    for size, entry in result["sizes"].items():
        for v, r in entry["variants"].items():
            if "step_ms" in r:
                lo, hi = r["repeats"]["min"]["step_ms"], r["repeats"]["max"]["step_ms"]
                meas = f"{r['mfu_measured_peak']:9.3f}" if r.get("mfu_measured_peak") is not None else f"{'-':>9s}"
                print(
                    f"{size:6s} {v:10s} {r['step_ms']:9.1f} {f'{lo:.1f}-{hi:.1f}':>13s} {r['frames_per_s']:10.0f} "
                    f"{r['mfu_datasheet']:9.3f} {meas}"
                )
            else:
                print(f"{size:6s} {v:10s} {r['error'][:60]}")
        if "speedup_vs_torchaudio_compiled" in entry:
            print(
                f"{size}: best ours ({entry['best_ours']}) is {entry['speedup_vs_torchaudio_compiled']}x torchaudio compiled"
            )


if __name__ == "__main__":
    main()
