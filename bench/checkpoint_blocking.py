"""How long a checkpoint keeps the training loop waiting: written in the loop against in the background.

    PYTHONPATH=. python bench/checkpoint_blocking.py [--sizes large,usm600m] [--repeats 3] [--dir /tmp] [--json OUT]

For each model size, the real ``Trainer`` of a CTC task (``usmkit.tasks.build_task`` on the named preset,
``usmkit.models.presets``) with AdamW state for every parameter (one optimizer step on constant gradients),
on the CPU. Each repetition runs ``Trainer.save()`` once with ``trainer.async_save=false`` and once with
``true``, alternating which goes first, each on a fresh ``Trainer`` over the same module:

- ``blocked_s``: ``Trainer.checkpoint_s``, how long ``save()`` kept the loop waiting: the whole write
  (safetensors, SHA-256 of every file, fsync, rename) in the loop; the copy into host memory in the
  background (no write was in flight: each repetition waits for it first, as a run whose ``save_every``
  steps take longer than a write does);
- ``write_s``: in the background, how long the writer thread took for the checkpoint
  (``CheckpointWriter.last_write_s``);
- ``probe_*``: while that write runs, the main thread keeps doing small matmuls (a stand-in for the loop's
  host work, one torch thread): its longest pause (``probe_longest_pause_s``) and its rate against the same
  probe run right after, with no write (``probe_rate_vs_idle``): whether the writer thread lets the loop run.

Checkpoints go to a temporary folder under ``--dir`` and are deleted after each repetition.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import gc
import resource
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from tools.results import result_path, run_header, write_result
from usmkit.config import ModelSection, OptimConfig, TaskConfig, TrainerConfig
from usmkit.tasks import build_task
from usmkit.training.trainer import Trainer

VOCAB = 256


class _NoBatches:
    """A loader the benchmark never iterates (``save()`` reads its position only)."""

    epoch = 0

    def __iter__(self):
        return iter(())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


def _trainer(module: torch.nn.Module, exp: Path, async_save: bool, step: int) -> Trainer:
    """A Trainer over ``module`` at ``step`` whose AdamW holds a state for every parameter."""
    cfg = TrainerConfig(exp_dir=str(exp), max_steps=10**6, device="cpu", progress=False, keep_last=1,
                        async_save=async_save)  # fmt: skip
    trainer = Trainer(cfg, OptimConfig(lr=1e-4, warmup_steps=1), module, _NoBatches(), "bench: 1\n")
    for p in module.parameters():
        p.grad = torch.full_like(p, 1e-3)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step = step
    return trainer


def _probe(until: threading.Event | None, seconds: float = 2.0) -> dict:
    """Small matmuls in this thread, on one torch thread, until ``until`` is set (or for ``seconds``): their
    rate and the longest pause between two of them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core's worth of work, like the loop's host thread
    a = torch.randn(128, 128)
    start = last = time.perf_counter()
    longest, n = 0.0, 0
    while (until.is_set() is False) if until is not None else (last - start < seconds):
        a = torch.tanh(a @ a)
        now = time.perf_counter()
        longest, last, n = max(longest, now - last), now, n + 1
    torch.set_num_threads(threads)
    return {"rate": n / max(last - start, 1e-9), "longest_pause_s": longest}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(size: str, repeats: int, folder: Path) -> dict:
    torch.manual_seed(0)
    module = build_task(TaskConfig(kind="ctc"), ModelSection(preset=size).build_config(input_dim=80), VOCAB)
    params = sum(p.numel() for p in module.parameters())
    runs: list[dict] = []
    state_bytes = None
    for rep in range(repeats):
        order = (False, True) if rep % 2 == 0 else (True, False)
        for async_save in order:
            exp = Path(tempfile.mkdtemp(prefix=f"ckpt_{size}_", dir=folder))
            trainer = _trainer(module, exp, async_save, step=rep + 1)
            if state_bytes is None:
                state_bytes = _bytes(t for s in trainer.optimizer.state.values() for t in s.values())
            trainer.save()
            row = {"repeat": rep, "async_save": async_save, "blocked_s": round(trainer.checkpoint_s, 3)}
            if async_save:
                done = threading.Event()
                waiter = threading.Thread(target=lambda t=trainer, d=done: (t.writer.wait(), d.set()))
                waiter.start()
                probe = _probe(done)
                waiter.join()
                idle = _probe(None)  # the same probe right after, with nothing written
                row |= {
                    "write_s": round(trainer.writer.last_write_s, 3),
                    "probe_longest_pause_s": round(probe["longest_pause_s"], 3),
                    "probe_rate_vs_idle": round(probe["rate"] / idle["rate"], 3),
                }
            runs.append(row)
            print(f"{size:8s} repeat {rep}  {'async' if async_save else 'sync ':5s}  {row}", flush=True)
            del trainer
            gc.collect()
            shutil.rmtree(exp)

    def median(async_save: bool, key: str) -> float:
        return round(statistics.median(r[key] for r in runs if r["async_save"] == async_save), 3)

    weight_bytes = _bytes(module.state_dict().values())
    return {
        "size": size,
        "parameters": params,
        "weights_gb": round(weight_bytes / 1e9, 2),
        "optimizer_state_gb": round(state_bytes / 1e9, 2),
        "host_copy_gb": round((weight_bytes + state_bytes) / 1e9, 2),
        "sync_blocked_s": median(False, "blocked_s"),
        "async_blocked_s": median(True, "blocked_s"),
        "async_write_s": median(True, "write_s"),
        "probe_longest_pause_s": median(True, "probe_longest_pause_s"),
        "probe_rate_vs_idle": median(True, "probe_rate_vs_idle"),
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="large,usm600m", help="model presets (usmkit.models.presets)")
    ap.add_argument("--repeats", type=int, default=3, help="saves per size and mode, alternating sync and async")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoints are written")
    ap.add_argument("--note", default="", help="a note stored in the JSON (e.g. that the CPU is shared)")
    ap.add_argument("--json", default=result_path("checkpoint_blocking"))
    args = ap.parse_args()
    result = run_header(note=args.note, checkpoint_dir=args.dir, sizes=[])
    for size in args.sizes.split(","):
        result["sizes"].append(measure(size, args.repeats, Path(args.dir)))
        gc.collect()
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
    print(f"\n{'size':8s} {'params':>7s} {'copy GB':>7s} {'sync blocked':>12s} {'async blocked':>13s} "
          f"{'async write':>11s} {'probe pause':>11s} {'probe rate':>10s}")  # fmt: skip
    for row in result["sizes"]:
        print(
            f"{row['size']:8s} {row['parameters'] / 1e6:6.0f}M {row['host_copy_gb']:7.2f} "
            f"{row['sync_blocked_s']:11.2f}s {row['async_blocked_s']:12.2f}s {row['async_write_s']:10.2f}s "
            f"{row['probe_longest_pause_s']:10.2f}s {row['probe_rate_vs_idle']:10.2f}"
        )
    write_result(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
