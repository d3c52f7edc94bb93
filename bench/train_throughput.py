"""Training-step throughput on the GPU: eager vs compiled vs compiled + Triton attention, against
torchaudio's Conformer of the same width and depth (same conv front end and CTC head, compiled).

    PYTHONPATH=. python bench/train_throughput.py [--sizes base,large] [--steps 12] [--json OUT]

One step = forward, CTC loss, backward and a fused AdamW update, bf16 autocast with fp32 weights.
Frames are encoder frames (40 ms). MFU = 6 x parameters x frames / step time / peak, with the peak
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
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config

from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.models.conformer import ConformerEncoder  # noqa: E402
from usmkit.models.ctc import CTCHead, ctc_loss  # noqa: E402
from usmkit.models.presets import preset  # noqa: E402
from usmkit.models.subsampling import Conv2dSubsampling, output_lengths  # noqa: E402

SHAPES = {  # size -> (B, T encoder frames); the reference shapes
    "base": (32, 512),
    "large": (16, 768),
    "usm600m": (10, 768),  # 300 s of audio, the trainer's batch
}
DATASHEET_BF16 = 989e12
VOCAB = 512


class OursCTC(torch.nn.Module):
    def __init__(self, size: str, impl: str, chunk: int | None, conv_impl: str = "torch"):
        super().__init__()
        cfg = preset(size, attention_impl=impl, chunk_size=chunk, left_chunks=0, dropout=0.0, conv_impl=conv_impl)
        self.encoder = ConformerEncoder(cfg)
        self.head = CTCHead(self.encoder.output_dim, VOCAB)

    def forward(self, feats, lens, tokens, token_lens):
        enc, enc_lens = self.encoder(feats, lens)
        return ctc_loss(self.head(enc), enc_lens, tokens, token_lens)


class TorchaudioCTC(torch.nn.Module):
    """torchaudio.models.Conformer between the same conv subsampling and CTC head as ours."""

    def __init__(self, size: str):
        super().__init__()
        import torchaudio

        cfg = preset(size)
        self.subsampling = Conv2dSubsampling(cfg.input_dim, cfg.conv_channels, cfg.d_model, 0.0)
        self.conformer = torchaudio.models.Conformer(
            input_dim=cfg.d_model,
            num_heads=cfg.num_heads,
            ffn_dim=cfg.ff_mult * cfg.d_model,
            num_layers=cfg.num_layers,
            depthwise_conv_kernel_size=cfg.conv_kernel,
            dropout=0.0,
        )
        self.head = CTCHead(cfg.d_model, VOCAB)

    def forward(self, feats, lens, tokens, token_lens):
        x, x_lens = self.subsampling(feats, lens)
        x, x_lens = self.conformer(x, x_lens)
        return ctc_loss(self.head(x), x_lens, tokens, token_lens)


def bf16_residual(model: OursCTC) -> None:
    """Make each block return its LayerNorm's output in bf16 (autocast gives fp32), for ``_bf16res``."""
    for block in model.encoder.blocks:
        norm = block.norm
        block.norm = torch.nn.Sequential(norm, _ToBF16())


class _ToBF16(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


def make_batch(B: int, T: int, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n_feat = 4 * T + 3  # -> exactly T encoder frames
    feats = torch.randn(B, n_feat, 80, generator=g)
    lens = torch.full((B,), n_feat, dtype=torch.long)
    assert int(output_lengths(lens)[0]) == T
    U = T // 4
    tokens = torch.randint(4, VOCAB, (B, U), generator=g)
    token_lens = torch.full((B,), U, dtype=torch.long)
    return [t.to(device) for t in (feats, lens, tokens, token_lens)]


def measure_peak(device) -> float:
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * 8192**3 / statistics.median(times)


def compile_regions(model: torch.nn.Module, dynamic: bool, mode: str | None = None, whole: bool = False) -> None:
    if whole:
        model.compile(dynamic=dynamic, mode=mode)
        return
    if isinstance(model, OursCTC):
        regions = [model.encoder.subsampling, *model.encoder.blocks, model.head]
    else:
        regions = [model.subsampling, *model.conformer.conformer_layers, model.head]
    for r in regions:
        r.compile(dynamic=dynamic, mode=mode)


def make_step(model, batch, params=None):
    """One training step as a closure: zero grads, bf16-autocast forward (CTC loss), backward, fused AdamW.

    ``model`` may be a DDP wrapper; ``params`` are then the wrapped module's parameters.
    """
    opt = torch.optim.AdamW(model.parameters() if params is None else params, lr=1e-4, fused=True)

    def step():
        torch.compiler.cudagraph_mark_step_begin()  # a new step for CUDA-graph replays; a no-op otherwise
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(*batch)
        loss.backward()
        opt.step()
        return loss.detach().clone()  # a CUDA graph's output is overwritten by the next replay

    return step


def timed(step, n: int, before=None) -> list[float]:
    """GPU milliseconds of ``n`` calls of ``step`` (CUDA events, synchronized each time); ``before`` runs first each time."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


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
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    times = timed(step, steps)
    return {
        "step_ms": statistics.median(times),
        "step_ms_min": min(times),
        "warmup_s": round(warmup_s, 1),
        "loss_finite": bool(torch.isfinite(loss).item()),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="base,large")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--chunk", type=int, default=128, help="encoder-frame chunk of our model (left_chunks=0)")
    ap.add_argument("--variants", default="eager,static,dynamic,triton,ta_eager,ta_static")
    ap.add_argument("--json", default=result_path("train_throughput"))
    args = ap.parse_args()
    device = torch.device("cuda")
    peak = measure_peak(device)
    result = run_header(measured_bf16_matmul_tflops=round(peak / 1e12, 1), chunk_size=args.chunk, sizes={})
    variants = args.variants.split(",")
    for size in args.sizes.split(","):
        B, T = SHAPES[size]
        batch = make_batch(B, T, device)
        frames = B * T
        entry = {"B": B, "T": T, "frames_per_step": frames, "variants": {}}
        result["sizes"][size] = entry
        for v in variants:
            torch.manual_seed(0)
            torch._dynamo.reset()
            torch.cuda.reset_peak_memory_stats()
            try:
                if v.startswith("ta_"):
                    model = TorchaudioCTC(size).to(device)
                    mode = v[3:] if v != "ta_eager" else None
                else:
                    impl = "triton" if "triton" in v else "sdpa"
                    model = OursCTC(size, impl, args.chunk).to(device)
                    mode = None if v == "eager" else v.replace("triton", "static")
                    if v.endswith("_bf16res"):
                        bf16_residual(model)
                params = sum(p.numel() for p in model.parameters())
                r = time_steps(model, batch, args.steps, mode)
                r["params_M"] = round(params / 1e6, 1)
                r["frames_per_s"] = round(frames / (r["step_ms"] / 1e3))
                flops = 6 * params * frames
                r["mfu_datasheet"] = round(flops / (r["step_ms"] / 1e3) / DATASHEET_BF16, 3)
                r["mfu_measured_peak"] = round(flops / (r["step_ms"] / 1e3) / peak, 3)
            except Exception as e:  # record and go on: one failing variant must not lose the others
                r = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            entry["variants"][v] = r
            del model
            torch.cuda.empty_cache()
            print(f"{size:6s} {v:10s} {json.dumps(r)}", flush=True)
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
    print(f"\n{'size':6s} {'variant':10s} {'ms/step':>9s} {'frames/s':>10s} {'MFU(989)':>9s} {'MFU(meas)':>9s}")
    for size, entry in result["sizes"].items():
        for v, r in entry["variants"].items():
            if "step_ms" in r:
                print(
                    f"{size:6s} {v:10s} {r['step_ms']:9.1f} {r['frames_per_s']:10d} {r['mfu_datasheet']:9.3f} {r['mfu_measured_peak']:9.3f}"
                )
            else:
                print(f"{size:6s} {v:10s} {r['error'][:60]}")
        if "speedup_vs_torchaudio_compiled" in entry:
            print(
                f"{size}: best ours ({entry['best_ours']}) is {entry['speedup_vs_torchaudio_compiled']}x torchaudio compiled"
            )


if __name__ == "__main__":
    main()
