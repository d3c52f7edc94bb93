"""GPU benchmark: the Conformer convolution module, compiled, forward + backward: PyTorch operations fused by
inductor (``conv_impl="torch"``) against the fused Triton middle (``conv_impl="triton"``).

    PYTHONPATH=. python bench/conv_module.py [--shapes 10x768x1024x5,14x512x1024x5] [--packed] [--json OUT]

Per shape (B rows, T frames, D channels, K taps; default: `usm600m`'s width at the trainer's 300-s batches, one
utterance per row and packed rows of 512 encoder frames), bf16 autocast as the trainer runs: both modules with
the same weights, each under ``torch.compile`` (as the trainer compiles each block); first the outputs and
parameter gradients of the two are compared, then forward + backward is timed as CUDA-graph replays (GPU time
alone; ``bench/attention.py``'s method) and the effective bandwidth counted on the (B, T, D) tensors the module
must read and write at the least (x, the output, their gradients: 4 x B x T x D x 2 bytes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import _graph_ms, _median_ms  # noqa: E402
from common import result_path, run_header, write_result  # noqa: E402

from usmkit.models.convolution import ConvolutionModule  # noqa: E402


def measure(B: int, T: int, D: int, K: int, packed: bool) -> dict:
    torch.manual_seed(0)
    modules = {
        impl: ConvolutionModule(D, K, causal=False, dropout=0.0, impl=impl).cuda() for impl in ("torch", "triton")
    }
    modules["triton"].load_state_dict(modules["torch"].state_dict())
    x = torch.randn(B, T, D, device="cuda", requires_grad=True)
    dout = torch.randn(B, T, D, device="cuda")
    if packed:  # utterances of 13-205 frames back to back, a padded frame at each row's end
        lengths = torch.randint(13, 206, (B * T // 13,), generator=torch.Generator().manual_seed(0))
        ids = torch.full((B, T), -1, dtype=torch.long)
        u, r, t = 0, 0, 0
        for n in lengths.tolist():
            if t + n > T - 1:
                r, t = r + 1, 0
                if r == B:
                    break
            ids[r, t : t + n] = u
            u, t = u + 1, t + n
        ids = ids.cuda()
        valid = ids >= 0
    else:
        ids, valid = None, torch.ones(B, T, dtype=torch.bool, device="cuda")
    row: dict = {"B": B, "T": T, "D": D, "K": K, "packed": packed}
    compiled = {impl: torch.compile(m) for impl, m in modules.items()}
    outs = {}
    for impl, fn in compiled.items():
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(x, valid, ids)
        out.float().backward(dout)
        outs[impl] = (out.float(), x.grad.clone(), {n: p.grad.clone() for n, p in modules[impl].named_parameters()})
    (o0, g0, p0), (o1, g1, p1) = outs["torch"], outs["triton"]
    row["max_rel_diff"] = {
        "out": ((o1 - o0).norm() / o0.norm()).item(),
        "dx": ((g1 - g0).norm() / g0.norm()).item(),
        **{n: ((p1[n] - p0[n]).norm() / p0[n].norm().clamp_min(1e-12)).item() for n in p0},
    }
    least_bytes = 4 * B * T * D * 2
    for impl, fn in compiled.items():

        def step(fn=fn):
            x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fn(x, valid, ids)
            out.backward(dout.to(out.dtype))

        ms = _graph_ms(step)
        timing = "cuda_graph"
        if ms is None:  # capture failed: time the eager calls (host launch time included)
            ms, timing = _median_ms(step), "eager"
        row[impl] = {
            "ms": ms,
            "timing": timing,
            "least_bytes_gb_s": round(least_bytes / (ms * 1e-3) / 1e9) if ms else None,
        }
    row["speedup"] = row["torch"]["ms"] / row["triton"]["ms"] if row["torch"]["ms"] and row["triton"]["ms"] else None
    print(f"B={B} T={T} D={D} K={K} packed={packed}: torch {row['torch']['ms']:.3f} ms, triton "
          f"{row['triton']['ms']:.3f} ms ({row['speedup']:.2f}x); rel. diff {max(row['max_rel_diff'].values()):.2e}",
          flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="10x768x1024x5,14x512x1024x5", help="BxTxDxK, comma-separated")
    ap.add_argument("--json", default=result_path("conv_module"))
    args = ap.parse_args()
    result = run_header()
    result["rows"] = []
    for shape in args.shapes.split(","):
        B, T, D, K = (int(v) for v in shape.split("x"))
        for packed in (False, True):
            result["rows"].append(measure(B, T, D, K, packed))
    write_result(args.json, result)


if __name__ == "__main__":
    main()
