"""Compile time and step time of ``trainer.compile_scope=whole`` against ``blocks``, side by side.

    PYTHONPATH=. python experiments/compile_scope/compile_scope.py [--model small] [--batch 4] [--frames 256] [--steps 5] [--json OUT]

One training step = forward of the CTC task (AsrModel), backward and AdamW, fp32, on whatever device
is there (this CPU by default). ``whole`` compiles the task's forward as one graph, as
``trainer.compile_scope=whole`` does; ``blocks`` compiles each Conformer block and the front end
(``usmkit.training.compile_blocks``). Inductor's on-disk caches are off, so each variant compiles from
scratch. First step = compile + one step; then the median of ``--steps`` steps.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.results import result_path, run_header, write_result  # noqa: E402
from usmkit.data.batch import Batch  # noqa: E402
from usmkit.models.asr import AsrHeadConfig, AsrModel  # noqa: E402
from usmkit.models.conformer import ConformerEncoder  # noqa: E402
from usmkit.models.presets import preset  # noqa: E402
from usmkit.training.compile_blocks import compile_blocks  # noqa: E402
from usmkit.training.task_spec import compile_units  # noqa: E402


def make_batch(B: int, T: int, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(0)
    U = T // 16
    return Batch(
        features=torch.randn(B, T, 80, generator=g), feature_lens=torch.full((B,), T),
        tokens=torch.randint(4, 256, (B, U), generator=g), token_lens=torch.full((B,), U),
    ).to(device)  # fmt: skip


def run(scope: str, args, device: torch.device) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AsrModel(ConformerEncoder(preset(args.model, dropout=0.0)), vocab_size=256, cfg=AsrHeadConfig()).to(device)
    step_fn = model
    if scope == "whole":
        step_fn = torch.compile(model, dynamic=False)
    elif scope == "blocks":
        compile_blocks(compile_units(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(args.batch, args.frames, device)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_fn(batch).loss
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = step()
    times = [step() for _ in range(args.steps)]
    return {"first_step_s": round(first, 1), "step_ms": round(1e3 * statistics.median(times), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=result_path(__file__))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = run_header(model=args.model, batch=args.batch, frames=args.frames, variants={})
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        for scope in ("eager", "whole", "blocks"):
            result["variants"][scope] = run(scope, args, device)
            print(scope, result["variants"][scope], flush=True)
    write_result(args.json, result)
    print(f"\n{'scope':8s} {'first step (s)':>15s} {'step (ms)':>10s}")
    for scope, r in result["variants"].items():
        print(f"{scope:8s} {r['first_step_s']:15.1f} {r['step_ms']:10.1f}")


if __name__ == "__main__":
    main()
