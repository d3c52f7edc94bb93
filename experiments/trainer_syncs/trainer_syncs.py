"""Where the trainer's host waits for the GPU: the synchronizing CUDA calls of each training step, by call site.

    PYTHONPATH=. python experiments/trainer_syncs/trainer_syncs.py [--steps 40] [--skip 20] [--json OUT] -- OVERRIDE...
    e.g. -- recipe=stage3_ctc model=large data.manifest_dir=data/synth data.max_duration=300 \\
            data.pad_to_frames=256 trainer.compile=true trainer.precision=bf16

Runs ``usmkit.training.recipe.run`` in this process for ``--steps`` optimizer steps under
``torch.cuda.set_sync_debug_mode("warn")``: every call that makes the host wait for the device (an
``.item()``, a device-to-host copy, a stream synchronize) warns. Each warning is attributed to the step
the trainer is in (the final checkpoint's to none) and to its call site: the innermost frame in
``usmkit/`` and the two innermost frames. Steps before ``--skip`` (compiling the first padded lengths)
are left out of the per-step table.
A sync every ``trainer.log_every`` steps (reading the logged scalars) is expected; one in every step
stops the host from queueing the next step while the device works.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback
import warnings
from pathlib import Path

from tools.results import run_header, write_result
from tools.train_runs import bench_train_config


def _frame(f: traceback.FrameSummary) -> str:
    name = f.filename.split("/usmkit/")[-1] if "/usmkit/" in f.filename else Path(f.filename).name
    return f"{name}:{f.lineno} {f.name}"


def site(stack: list[traceback.FrameSummary]) -> str:
    """``usmkit/x.py:N fn <- the two innermost frames`` for a warning's Python stack (its own frames left out)."""
    stack = [f for f in stack if not f.filename.endswith(("/warnings.py", "trainer_syncs.py"))]
    ours = [f for f in stack if "/usmkit/" in f.filename]
    inner = " < ".join(_frame(f) for f in stack[-2:][::-1])
    return f"usmkit/{_frame(ours[-1])} <- {inner}" if ours else inner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=20, help="steps left out of the table (compiling)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import torch

    from usmkit.training import trainer as trainer_module
    from usmkit.training.recipe import run

    if not torch.cuda.is_available():
        raise SystemExit("trainer_syncs needs a CUDA device: synchronization is a device matter")
    cfg, config_yaml = bench_train_config("trainer_syncs", args.steps, args.overrides)

    step = [0]  # the step the trainer is in: counted by wrapping its forward-backward
    forward_backward = trainer_module.Trainer._forward_backward

    def counted(self, batch, sync):
        step[0] = self.step + 1
        return forward_backward(self, batch, sync)

    save = trainer_module.Trainer.save

    def saving(self):  # a checkpoint's syncs (reading every tensor) are not a step's
        step[0] = -1
        return save(self)

    trainer_module.Trainer._forward_backward = counted
    trainer_module.Trainer.save = saving
    syncs: collections.Counter[tuple[int, str]] = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            syncs[(step[0], site(traceback.extract_stack()))] += 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    t0 = time.perf_counter()
    run(cfg, config_yaml)
    torch.cuda.set_sync_debug_mode("default")
    elapsed = time.perf_counter() - t0

    counted_steps = max(args.steps - args.skip, 1)
    per_site: collections.Counter[str] = collections.Counter()
    for (s, where), n in syncs.items():
        if s > args.skip:
            per_site[where] += n
    print(
        f"{'syncs/step':>10s}  call site (steps {args.skip + 1}-{args.steps}; trainer.log_every={cfg.trainer.log_every})"
    )
    for where, n in per_site.most_common():
        print(f"{n / counted_steps:10.2f}  {where}")
    total = sum(per_site.values()) / counted_steps
    print(f"{total:10.2f}  in all")
    if args.json:
        result = run_header(
            overrides=args.overrides,
            steps=args.steps,
            skip=args.skip,
            log_every=cfg.trainer.log_every,
            syncs_per_step=round(total, 3),
            sites={where: round(n / counted_steps, 3) for where, n in per_site.most_common()},
            wall_s=round(elapsed, 1),
        )
        write_result(args.json, result)


if __name__ == "__main__":
    main()
