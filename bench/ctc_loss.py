"""CTC loss forward + backward on the GPU: aten's CUDA CTC (the CPU path's custom op, which reads the lengths on
the host) against our Triton kernels (lengths on the device), on training-sized batches.

    PYTHONPATH=. python bench/ctc_loss.py [--json OUT]

For each shape: device time per forward + backward (CUDA events, the host waiting for nothing else), and the host
time of one call when the GPU is already busy with queued work (a 50 ms matmul chain): aten's call waits for that
work (it synchronizes), ours returns at once. Checks the two losses agree first.
Writes ``bench/results/ctc_loss.json`` (``$OUT/ctc_loss.json`` on the lent GPUs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.kernels.ctc import ctc_nll_triton  # noqa: E402
from usmkit.models.ctc import BLANK_ID, ctc_nll  # noqa: E402  (ctc_nll: the aten path)

# name -> (B utterances, T encoder frames, U max tokens, V vocabulary)
SHAPES = {
    "fixed 2.56 s x 117 (large_cg's shortest batch)": (117, 64, 40, 512),
    "fixed 10.24 s x 29": (29, 256, 160, 512),
    "30 s x 10": (10, 750, 300, 512),
}


def batch(B, T, U, V, device):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=gen)
    token_lens = torch.minimum(torch.randint(U // 2, U + 1, (B,), generator=gen), lengths // 2)
    tokens = torch.randint(1, V, (B, U), generator=gen)
    logits = torch.randn(B, T, V, generator=gen)
    return [x.to(device) for x in (logits, tokens, lengths, token_lens)]


def run(fn, logits, tokens, lengths, token_lens):
    x = logits.detach().requires_grad_()
    nll = fn(x.log_softmax(-1).transpose(0, 1), tokens, lengths, token_lens)
    nll.sum().backward()
    return nll.detach()


def device_ms(fn, args, reps=20) -> float:
    for _ in range(3):
        run(fn, *args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        run(fn, *args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def host_ms_behind_busy_gpu(fn, args, reps=5) -> float:
    """Host time of one forward + backward call while ~50 ms of matmuls are still queued on the GPU."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        for _ in range(60):
            a = (a @ a).clamp_(-1, 1)
        t0 = time.perf_counter()
        run(fn, *args)
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=result_path("ctc_loss"))
    args = ap.parse_args()
    device = torch.device("cuda")
    result = run_header(shapes={})
    impls = {"aten": ctc_nll, "triton": lambda *args: ctc_nll_triton(*args, BLANK_ID)}
    print(f"{'shape':48s} {'aten ms':>8s} {'triton ms':>9s} {'x':>5s} {'aten host ms*':>13s} {'triton host ms*':>15s}")
    for name, (B, T, U, V) in SHAPES.items():
        data = batch(B, T, U, V, device)
        losses = {k: run(fn, *data) for k, fn in impls.items()}
        max_diff = (losses["aten"] - losses["triton"]).abs().max().item()
        dev = {k: device_ms(fn, data) for k, fn in impls.items()}
        host = {k: host_ms_behind_busy_gpu(fn, data) for k, fn in impls.items()}
        result["shapes"][name] = {
            "B": B, "T": T, "U": U, "V": V, "max_abs_loss_diff": max_diff,
            "device_ms": {k: round(v, 3) for k, v in dev.items()},
            "speedup": round(dev["aten"] / dev["triton"], 2),
            "host_ms_behind_busy_gpu": {k: round(v, 2) for k, v in host.items()},
        }  # fmt: skip
        print(f"{name:48s} {dev['aten']:8.3f} {dev['triton']:9.3f} {dev['aten'] / dev['triton']:5.2f} "
              f"{host['aten']:13.2f} {host['triton']:15.2f}", flush=True)  # fmt: skip
        assert max_diff <= 1e-4 * max(1.0, losses["aten"].abs().max().item()), f"{name}: losses differ by {max_diff}"
    print("* host time of a call made while ~50 ms of matmuls are queued: a synchronizing call waits for them")
    write_result(args.json, result)
    print("wrote", args.json)


if __name__ == "__main__":
    main()
