"""DDP scaling of the compiled training step: the same per-GPU batch on 1 and on N GPUs.

    torchrun --standalone --nproc-per-node N bench/ddp_scaling.py --size base --steps 10 --json OUT

With N > 1 each run also times the same step under ``ddp.no_sync()`` (no all-reduce), interleaved
with the synchronized one: ``scaling_vs_no_sync`` = N x no-sync time / synchronized time is the
scaling measured side by side, immune to the run-to-run drift of a shared machine (the separate
1-GPU run's time moved 63-78 ms between runs on one H200 host).
Run once with N=1 and once with N=2; each run writes its aggregate frames/s to the JSON file
(``runs`` keyed by world size, plus ``/variant`` for N > 1 with DDP options) and, once both are
there, the scaling factor of each variant. DDP options, to trade the all-reduce's cost:
``--bucket-mb`` (gradient bucket size), ``--grad-view`` (gradients are views into the buckets: no copy),
``--static-graph`` (the same parameters are used every step), ``--bf16-hook`` (all-reduce bf16
copies of the gradients: half the bytes, gradients rounded to bf16 before the mean); the environment
variable ``NCCL_MAX_NCHANNELS`` (recorded in the key) caps the SMs NCCL's kernels occupy.
``--cuda-graphs`` compiles the regions with ``mode="reduce-overhead"`` (each region's forward and
backward replay as CUDA graphs; DDP's all-reduce hooks run between them, outside the graphs).
Same step as bench/train_throughput.py (``static`` variant, regional compile, bf16, fused AdamW).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.train_step import SHAPES, OursCTC, compile_regions, make_batch, make_step, timed  # noqa: E402

BLOCK = 5  # steps per timed block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="base")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default=result_path("ddp_scaling"))
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--grad-view", action="store_true")
    ap.add_argument("--static-graph", action="store_true")
    ap.add_argument("--bf16-hook", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--batch", type=int, default=0, help="per-GPU batch size B (0: the size's default)")
    args = ap.parse_args()
    options = [f"bucket{args.bucket_mb:g}MB"] + [
        name for name, on in (("grad_view", args.grad_view), ("static_graph", args.static_graph),
                              ("bf16_hook", args.bf16_hook), ("cuda_graphs", args.cuda_graphs)) if on
    ]  # fmt: skip
    if os.environ.get("NCCL_MAX_NCHANNELS"):  # fewer NCCL channels: fewer SMs taken from the overlapped backward
        options.append(f"nccl_ch{os.environ['NCCL_MAX_NCHANNELS']}")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    B, T = SHAPES[args.size]
    B = args.batch or B
    model = OursCTC(args.size, "sdpa", 128).to(device)
    compile_regions(model, dynamic=False, mode="reduce-overhead" if args.cuda_graphs else None)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index],
        broadcast_buffers=False,
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=args.grad_view,
        static_graph=args.static_graph,
    )
    if args.bf16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    batch = make_batch(B, T, device, seed=rank)
    step = make_step(ddp, batch, params=model.parameters())

    def local_step():  # the same step on each GPU with no gradient all-reduce: N GPUs working alone
        with ddp.no_sync():
            return step()

    for _ in range(3):
        step()
        local_step()
    torch.cuda.synchronize()
    # Interleaved blocks, so both see the same machine state (clocks, neighbours, CPU load). Each block
    # runs BLOCK steps back to back, as training does (the host queues the next step while the GPU
    # works), and is timed as a whole: per-step synchronization would add the host's launch latency
    # at the start of every step to both sides.
    times, local_times = [], []
    for _ in range(max(1, args.steps // BLOCK)):
        times += timed(lambda: [step() for _ in range(BLOCK)], 1, before=dist.barrier)
        local_times += timed(lambda: [local_step() for _ in range(BLOCK)], 1, before=dist.barrier)
    times, local_times = [t / BLOCK for t in times], [t / BLOCK for t in local_times]
    ms = torch.tensor([statistics.median(times), statistics.median(local_times)], device=device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    ms, local_ms = ms.tolist()
    if rank == 0:
        path = Path(args.json)
        res = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
        res |= run_header(
            size=args.size,
            per_gpu_batch={"B": B, "T": T},
            timing=f"median over blocks of {BLOCK} back-to-back steps, sync and no-sync blocks interleaved",
        )
        # torchrun started this process: record the launch, not the worker's command line
        res["command"] = res["command"].replace(
            "PYTHONPATH=. python ", f"PYTHONPATH=. torchrun --standalone --nproc-per-node {world} ", 1
        )
        key = (str(world) if world == 1 else f"{world}/{'+'.join(options)}") + (f"/B{B}" if args.batch else "")
        res["runs"][key] = {"step_ms": ms, "frames_per_s": round(world * B * T / (ms / 1e3))}
        if world > 1:  # scaling measured side by side: N GPUs synchronized vs the same N working alone
            res["runs"][key] |= {"no_sync_step_ms": local_ms, "scaling_vs_no_sync": round(world * local_ms / ms, 3)}
        res["scaling"] = {}  # against the separate 1-GPU run with the same per-GPU batch
        for k, r in res["runs"].items():
            one = res["runs"].get("1" + (f"/{k.split('/')[-1]}" if k.split("/")[-1].startswith("B") else ""))
            if not k.startswith("1") and one:
                res["scaling"][k] = round(r["frames_per_s"] / one["frames_per_s"], 3)
        write_result(path, res)
        print(f"{'run':36s} {'ms/step':>8s} {'frames/s':>10s} {'scaling':>8s} {'vs no-sync':>10s}")
        for k, r in res["runs"].items():
            scaling = res["scaling"].get(k)
            print(f"{k:36s} {r['step_ms']:8.1f} {r['frames_per_s']:10d} {scaling or '-':>8} "
                  f"{r.get('scaling_vs_no_sync', '-'):>10}")  # fmt: skip
        print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
