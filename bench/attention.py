"""GPU benchmark: Triton chunk attention against dense-mask SDPA and compiled FlexAttention.

Run on the GPU machine from the repository root:

    PYTHONPATH=. python bench/attention.py   # writes bench/results/attention.json ($OUT/attention.json if set)

Steps: versions and device; the device's ceilings (device-to-device copy bandwidth, bf16 matmul rate on random
data); then per shape (B, T, H, D, chunk, left), lengths uniform in [T/2, T], bf16:
1. correctness of every implementation (forward and dq/dk/dv) against the reference run in fp32 on upcast
   inputs, by ||x - ref|| / ||ref||, with poisoned (NaN) memory under the outputs;
2. timing with ``triton.testing.do_bench`` (median; it clears the L2 between runs), forward and forward+backward,
   twice: ``*_ms`` times CUDA-graph replays of the call (GPU time alone, for every implementation) and
   ``*_eager_ms`` the eager call (which also pays the host's launch time where the host is the slower side).
SDPA gets its dense boolean mask, FlexAttention its BlockMask and ``torch.compile(flex_attention)``, all built
outside the timed region. FLOP/s count useful (unmasked) pairs only: forward 4*D per visible (query, key) pair,
forward+backward 3.5x that (the FlashAttention convention: 2 matmuls forward, 5 backward).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.flex_attention import flex_attention
from triton.testing import do_bench

from tools.results import result_path, run_header, write_result
from usmkit.kernels.chunk_attention import chunk_attention
from usmkit.kernels.chunk_attention import triton as kernels
from usmkit.kernels.chunk_attention.flex import chunk_block_mask
from usmkit.kernels.chunk_attention.reference import chunk_attention_reference
from usmkit.kernels.masks import lengths_to_padding_mask, padded_chunk_mask

# (B, T, H, D, chunk_size, left_chunks)
SHAPES = [
    (32, 512, 8, 64, 64, 0),
    (32, 512, 8, 64, 32, 4),
    (16, 1024, 8, 64, 64, 0),
    (8, 1024, 16, 96, 200, 0),
    (8, 2048, 16, 128, 128, 2),
]
DTYPE = torch.bfloat16
MAX_REL_ERR = 1e-2  # bf16 inputs: expected between 1e-3 and 1e-2 against an fp32 reference


def _median_ms(fn, grad_to_none=None) -> float:
    return float(do_bench(fn, warmup=25, rep=200, grad_to_none=grad_to_none, return_mode="median"))


def _graph_ms(fn) -> float | None:
    """GPU time alone: fn captured in a CUDA graph, replays timed by do_bench (no host launch time in it)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return _median_ms(graph.replay)
    except Exception as error:  # a capture failure must not cost the other numbers
        print(f"graph capture failed: {error!r}", flush=True)
        return None


def measure_ceilings() -> dict[str, float]:
    """Copy bandwidth (bytes read + written per second) and bf16 matmul rate, on random data."""
    x = torch.randn(256 * 2**20, device="cuda", dtype=torch.bfloat16)  # 512 MiB
    y = torch.empty_like(x)
    copy_ms = _median_ms(lambda: y.copy_(x))
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = _median_ms(lambda: a @ b)
    return {
        "copy_GBps": 2 * x.numel() * x.element_size() / copy_ms / 1e6,
        "bf16_matmul_TFLOPs": 2 * n**3 / mm_ms / 1e9,
    }


def _poison() -> None:
    """Leave NaN in the caching allocator's free memory, so an output element the kernel skips shows up."""
    free, _ = torch.cuda.mem_get_info()
    x = torch.empty(min(free // 2, 16 * 2**30) // 4, device="cuda", dtype=torch.float32)
    x.fill_(float("nan"))
    del x


def _impls(lengths: torch.Tensor, T: int, chunk: int, left: int):
    """Forward functions (q, k, v) -> out, each with its masks prebuilt here, outside any timed region."""
    mask = padded_chunk_mask(lengths, T, chunk, left)  # (B, T, T)
    padded = lengths_to_padding_mask(lengths, T)  # (B, T)
    # As usmkit/kernels/chunk_attention/sdpa.py: padded query rows see key 0 (no NaN), then are zeroed.
    sdpa_mask = (mask | (padded[:, :, None] & (torch.arange(T, device=mask.device) == 0)))[:, None]  # (B, 1, T, T)
    pad4 = padded[:, None, :, None]  # (B, 1, T, 1)
    block_mask = chunk_block_mask(lengths, T, chunk, left)
    flex = torch.compile(flex_attention, dynamic=False)

    def triton_fn(q, k, v):
        return chunk_attention(q, k, v, lengths, chunk, left, impl="triton")

    def sdpa_fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask).masked_fill(pad4, 0.0)

    def flex_fn(q, k, v):
        return flex(q, k, v, block_mask=block_mask).masked_fill(pad4, 0.0)

    return {"triton": triton_fn, "sdpa": sdpa_fn, "flex": flex_fn}


def _triton_launcher_fn(lengths, chunk, left, dq_mode):
    """Forward + backward through the launchers directly (no autograd), to compare the dQ strategies."""

    def run(q, k, v, dout):
        out, lse = kernels.chunk_attention_fwd(q, k, v, lengths, chunk, left)
        return out, *kernels.chunk_attention_bwd(dout, q, k, v, out, lse, lengths, chunk, left, dq_mode=dq_mode)

    return run


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def check_shape(q, k, v, dout, lengths, T, chunk, left, impls, dq_modes) -> dict[str, dict[str, float]]:
    """Relative errors of out/dq/dk/dv of every implementation against the fp32 reference."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref_out = chunk_attention_reference(*leaves, lengths, chunk, left)
    ref_out.backward(dout.float())
    refs = [ref_out.detach(), *(x.grad for x in leaves)]
    del leaves, ref_out
    padded = lengths_to_padding_mask(lengths, T)  # (B, T)

    def autograd_run(fn):
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = fn(*xs)
        out.backward(dout)
        return [out.detach(), *(x.grad for x in xs)]

    runs = {name: (lambda fn=fn: autograd_run(fn)) for name, fn in impls.items()}
    for mode in dq_modes:
        launchers = _triton_launcher_fn(lengths, chunk, left, mode)
        runs[f"triton_{mode}"] = lambda launchers=launchers: list(launchers(q, k, v, dout))
    errors: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        _poison()
        got = run()
        errors[name] = {n: _rel(g, r) for n, g, r in zip(("out", "dq", "dk", "dv"), got, refs, strict=True)}
        if name.startswith("triton"):
            for n, g in zip(("out", "dq", "dk", "dv"), got, strict=True):
                if not torch.isfinite(g).all():
                    raise RuntimeError(f"{name} {n}: non-finite values (unwritten or NaN)")
                if (g.transpose(1, 2)[padded] != 0).any():
                    raise RuntimeError(f"{name} {n}: padded frames are not exactly 0")
            worst = max(errors[name].values())
            if worst > MAX_REL_ERR:
                raise RuntimeError(f"{name}: relative error {worst:.3g} > {MAX_REL_ERR} ({errors[name]})")
        del got
        torch.cuda.synchronize()
    return errors


def time_shape(q, k, v, dout, lengths, chunk, left, impls, dq_modes) -> dict[str, float | None]:
    """For every implementation: GPU time (``*_ms``, CUDA-graph replay) and eager time (``*_eager_ms``)."""
    times: dict[str, float | None] = {}
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    for name, fn in impls.items():
        with torch.no_grad():
            fn(q, k, v)  # compile / autotune outside the timed region
            times[f"{name}_fwd_eager_ms"] = _median_ms(lambda fn=fn: fn(q, k, v))
            times[f"{name}_fwd_ms"] = _graph_ms(lambda fn=fn: fn(q, k, v))

        def step(fn=fn):
            fn(*leaves).backward(dout)

        def step_fresh(fn=fn):
            for x in leaves:
                x.grad = None
            fn(*leaves).backward(dout)

        step()
        times[f"{name}_eager_ms"] = _median_ms(step, grad_to_none=leaves)
        times[f"{name}_ms"] = _graph_ms(step_fresh)
    # Back-to-back eager wall time of the Triton forward+backward: what the host alone costs per call.
    fn = impls["triton"]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        fn(*leaves).backward(dout)
    torch.cuda.synchronize()
    times["triton_back_to_back_ms"] = (time.perf_counter() - start) / 50 * 1e3
    for mode in dq_modes:  # the two dQ strategies, through the launchers (no autograd), GPU time
        run = _triton_launcher_fn(lengths, chunk, left, mode)
        run(q, k, v, dout)
        times[f"triton_launchers_{mode}_ms"] = _graph_ms(lambda run=run: run(q, k, v, dout))
    return times


def _host_profile(fn, q, k, v, dout) -> None:
    """Where the host time of an eager forward+backward goes (top functions by own time)."""
    import cProfile
    import pstats

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]

    def steps():
        for _ in range(50):
            fn(*leaves).backward(dout)
        torch.cuda.synchronize()

    steps()
    profiler = cProfile.Profile()
    profiler.runcall(steps)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=result_path("attention"), help="the results JSON")
    parser.add_argument("--shapes", type=int, nargs="*", default=None, help="indices into SHAPES (default: all)")
    parser.add_argument("--check-only", action="store_true", help="correctness only, no timing")
    parser.add_argument("--host-profile", action="store_true", help="cProfile the Triton forward+backward host path")
    parser.add_argument("--dq-modes", nargs="+", default=["kernel"], choices=kernels.DQ_MODES, help="dQ strategies")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs a CUDA GPU")
    # One compiled flex_attention serves every shape, forward and forward+backward: more than the default 8.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 256

    result = run_header(
        triton=triton.__version__,
        dtype=str(DTYPE),
        flops_convention="useful pairs only; fwd 4*D per visible pair, fwd+bwd 3.5x fwd",
        timing="*_ms: triton.testing.do_bench median of CUDA-graph replays (GPU time alone, no host launch cost, "
        "L2 cleared between runs); *_eager_ms: do_bench median of the eager call (includes host time where the "
        "host is slower than the GPU); masks built outside the timed region; flex = torch.compile(flex_attention)",
    )
    print(f"device {result['device']}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    if not args.check_only:
        result["ceilings"] = measure_ceilings()
        print(f"ceilings {result['ceilings']}", flush=True)

    rows = []
    for i in args.shapes if args.shapes is not None else range(len(SHAPES)):
        B, T, H, D, chunk, left = SHAPES[i]
        gen = torch.Generator(device="cuda").manual_seed(1000 + i)
        lengths = torch.randint(T // 2, T + 1, (B,), device="cuda", generator=gen)
        q, k, v, dout = (torch.randn(B, H, T, D, device="cuda", dtype=DTYPE, generator=gen) for _ in range(4))
        impls = _impls(lengths, T, chunk, left)
        t0 = time.time()
        errors = check_shape(q, k, v, dout, lengths, T, chunk, left, impls, args.dq_modes)
        row = {"B": B, "T": T, "H": H, "D": D, "chunk": chunk, "left": left, "lengths": lengths.tolist()}
        row["rel_err"] = errors
        print(f"shape {SHAPES[i]} check ({time.time() - t0:.0f}s): " + json.dumps(errors), flush=True)
        if not args.check_only:
            pairs = H * padded_chunk_mask(lengths, T, chunk, left).sum().item()
            fwd_flop = 4 * D * pairs
            tensor_bytes = B * H * T * D * q.element_size()
            row.update(time_shape(q, k, v, dout, lengths, chunk, left, impls, args.dq_modes))
            failed = [key for key, value in row.items() if key.endswith("_ms") and value is None]
            for key in failed:  # graph capture failed: fall back to the eager time, and say so
                row[key] = row.get(key.replace("_ms", "_eager_ms")) or float("nan")
            row["graph_capture_failed"] = failed
            row["tuning"] = kernels.tuning_report()
            if args.host_profile and i == (args.shapes or [0])[0]:
                _host_profile(impls["triton"], q, k, v, dout)
            row["useful_fwd_gflop"] = fwd_flop / 1e9
            row["triton_tflops"] = 3.5 * fwd_flop / row["triton_ms"] / 1e9
            row["triton_fwd_tflops"] = fwd_flop / row["triton_fwd_ms"] / 1e9
            ceil = result["ceilings"]
            row["floor_ms"] = max(
                3.5 * fwd_flop / ceil["bf16_matmul_TFLOPs"] / 1e9, 12 * tensor_bytes / ceil["copy_GBps"] / 1e6
            )
            row["floor_fwd_ms"] = max(
                fwd_flop / ceil["bf16_matmul_TFLOPs"] / 1e9, 4 * tensor_bytes / ceil["copy_GBps"] / 1e6
            )
            row["speedup"] = min(row["sdpa_ms"], row["flex_ms"]) / row["triton_ms"]
            row["speedup_fwd"] = min(row["sdpa_fwd_ms"], row["flex_fwd_ms"]) / row["triton_fwd_ms"]
            row["speedup_eager"] = min(row["sdpa_eager_ms"], row["flex_eager_ms"]) / row["triton_eager_ms"]
            row["speedup_fwd_eager"] = (
                min(row["sdpa_fwd_eager_ms"], row["flex_fwd_eager_ms"]) / row["triton_fwd_eager_ms"]
            )
            print(
                f"shape {SHAPES[i]} ({time.time() - t0:.0f}s): "
                + json.dumps({k_: v_ for k_, v_ in row.items() if k_ not in ("lengths", "rel_err")}),
                flush=True,
            )
        rows.append(row)
        result["shapes"] = rows
        write_result(args.out, result)  # after every shape, so a run cut short still leaves its results
        del q, k, v, dout, impls
        torch.cuda.empty_cache()
    result["shapes"] = rows
    if not args.check_only:
        for name in ("speedup", "speedup_fwd", "speedup_eager", "speedup_fwd_eager"):
            result[f"geomean_{name}"] = math.exp(sum(math.log(r[name]) for r in rows) / len(rows))
        print(
            "\nGPU time (graph replay), ms         | fwd+bwd: triton sdpa flex speedup TFLOP/s floor | fwd: triton sdpa flex speedup"
        )
        for r in rows:
            shape = (r["B"], r["T"], r["H"], r["D"], r["chunk"], r["left"])
            print(
                f"{str(shape):36s} | {r['triton_ms']:.3f} {r['sdpa_ms']:.3f} {r['flex_ms']:.3f} {r['speedup']:.2f}x "
                f"{r['triton_tflops']:.0f} {r['floor_ms']:.3f} | {r['triton_fwd_ms']:.3f} {r['sdpa_fwd_ms']:.3f} "
                f"{r['flex_fwd_ms']:.3f} {r['speedup_fwd']:.2f}x"
            )
        print(
            "eager, ms                            | fwd+bwd: triton sdpa flex speedup | fwd: triton sdpa flex speedup"
        )
        for r in rows:
            shape = (r["B"], r["T"], r["H"], r["D"], r["chunk"], r["left"])
            print(
                f"{str(shape):36s} | {r['triton_eager_ms']:.3f} {r['sdpa_eager_ms']:.3f} {r['flex_eager_ms']:.3f} "
                f"{r['speedup_eager']:.2f}x | {r['triton_fwd_eager_ms']:.3f} {r['sdpa_fwd_eager_ms']:.3f} "
                f"{r['flex_fwd_eager_ms']:.3f} {r['speedup_fwd_eager']:.2f}x"
            )
        print(
            "geomean speedup: "
            + ", ".join(
                f"{n} {result[f'geomean_{n}']:.2f}x"
                for n in ("speedup", "speedup_fwd", "speedup_eager", "speedup_fwd_eager")
            )
        )
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
