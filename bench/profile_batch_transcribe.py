"""Batch transcription's main loop, phase by phase: where its seconds go between the first batch and the last line.

    PYTHONPATH=. python bench/profile_batch_transcribe.py --models usm600m,tiny --hours 10 --corpus DIR
    PYTHONPATH=. python bench/profile_batch_transcribe.py --cpu-plumbing        # tiny, CPU: the plumbing only

The same audio and random-weight checkpoints as ``batch_transcribe.py`` (``make_audio``,
``random_checkpoint``), transcribed in this process by ``usmkit.inference.batch_transcribe.transcribe_batch``
with the given ``--overrides`` (``key=value`` of ``BatchConfig``), twice per model:

1. **cold** (the model's first run in the process, as a user's run is), under ``torch.profiler`` on CUDA
   (``--trace``): the device's kernel time (summed, and as the union of busy intervals: the seconds of the
   loop the GPU computed), the CUDA runtime calls by total time on any host thread (``cudaHostAlloc`` from
   the DataLoader's pin-memory thread, ``cudaMalloc``, synchronizations), cProfile's main-thread functions
   with the most own time, and the graphs compiled during the loop (after the warm-up: none expected);
2. **warm** (the same again): the phases alone, and with ``--sync-debug`` the source lines of the
   operations that made the host wait for the device (``torch.cuda.set_sync_debug_mode``).

In both, the methods the loop calls are wrapped to add up their wall time: ``launch``
(``DeviceRunner.batch``: the copy to the device, features and encoder queued; of it ``features``, the
filterbank's launch), ``finish`` (``DeviceRunner._finish_greedy``: of it ``gpu_wait``, waiting for the
batch's results on the host, and ``emit``, each file's JSONL line), ``flush`` (the journal), and the
loader wait the command reports; ``rest`` is the loop's time outside them. Also each batch's arrival time
from the first (bursts show the workers, a steady rate the device).

Printed as a table; written to ``bench/results/profile_batch_transcribe[_<variant>].json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import cProfile
import json
import pstats
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import torch
from batch_transcribe import corpus_dir, make_audio, random_checkpoint

from tools.phase_timer import PhaseTimer
from tools.results import result_path, run_header, write_result
from usmkit.cli.compose import compose_dataclass
from usmkit.inference import batch_transcribe as bt
from usmkit.inference.batch_audio import FbankFrontEnd
from usmkit.inference.batch_runner import DeviceRunner, _HostCopy
from usmkit.inference.transcript_journal import JournalWriter

PHASES = {  # phase: (class, method); the indented ones run inside the one above
    "launch": (DeviceRunner, "batch"),
    "features": (FbankFrontEnd, "__call__"),
    "finish": (DeviceRunner, "_finish_greedy"),
    "gpu_wait": (_HostCopy, "wait"),
    "emit": (bt._Sink, "emit"),
    "flush": (JournalWriter, "flush"),
}
TOP_LEVEL = ("launch", "finish", "flush")


class LoopTimer(PhaseTimer):
    """``PHASES`` timed (``PhaseTimer``), and the loop's start: when ``_transcribe`` began and how many graphs
    torch had compiled by then. ``arrivals``: the times ``launch`` was called (a batch came from the loader)."""

    def __init__(self) -> None:
        super().__init__(PHASES)
        self.loop_start = 0.0
        self.graphs_at_loop_start = 0
        self._transcribe = bt._transcribe

    @property
    def arrivals(self) -> list[float]:
        return self.starts["launch"]

    def __enter__(self) -> LoopTimer:
        super().__enter__()

        def loop(*args, **kwargs):
            from torch._dynamo.utils import counters

            self.graphs_at_loop_start = counters["stats"]["unique_graphs"]
            self.loop_start = time.perf_counter()
            return self._transcribe(*args, **kwargs)

        bt._transcribe = loop
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        bt._transcribe = self._transcribe


def run_once(exp: Path, audio: Path, out: Path, overrides: list[str]) -> bt.BatchSummary:
    for p in out.parent.glob(out.name + "*"):
        p.unlink()
    cfg = compose_dataclass(
        bt.BatchConfig, [f"checkpoint={exp}", f"inputs={audio}", f"out={out}", "progress=false", *overrides],
        command="profile_batch_transcribe", usage="",
    )  # fmt: skip
    cfg.check()
    return bt.transcribe_batch(cfg)


def timed_run(exp: Path, audio: Path, out: Path, overrides: list[str]) -> dict:
    """One run with its phases timed, and the graphs torch.compile made during its loop."""
    from torch._dynamo.utils import counters

    with LoopTimer() as timer:
        summary = run_once(exp, audio, out, overrides)
    first = timer.arrivals[0] if timer.arrivals else timer.loop_start
    seconds = dict(timer.seconds)
    loop = summary.wall_seconds
    return {
        "files": summary.transcribed,
        "audio_s": round(summary.audio_seconds, 1),
        "loop_s": round(loop, 3),
        "rtfx": round(summary.rtfx, 1),
        "setup_s": round(summary.setup_seconds, 1),
        "loader_wait_s": round(summary.loader_wait_seconds, 3),
        "phases_s": {k: round(seconds.get(k, 0.0), 3) for k in PHASES},
        "rest_s": round(loop - summary.loader_wait_seconds - sum(seconds.get(k, 0.0) for k in TOP_LEVEL), 3),
        "batches": len(timer.arrivals),
        "arrivals_s": [round(t - first, 3) for t in timer.arrivals],
        "first_batch_after_s": round(first - timer.loop_start, 3),
        "graphs_compiled_in_loop": counters["stats"]["unique_graphs"] - timer.graphs_at_loop_start,
    }


def busy_union(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def cold(exp: Path, audio: Path, out: Path, overrides: list[str], trace: bool, top: int) -> dict:
    """The model's first run, under torch.profiler and cProfile when ``trace``."""
    if not trace:
        return timed_run(exp, audio, out, overrides)
    from torch.profiler import ProfilerActivity, profile

    profiler = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiler.enable()
        row = timed_run(exp, audio, out, overrides)
        profiler.disable()
    kernels, runtime = [], defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((e.time_range.start / 1e6, e.time_range.end / 1e6))  # us -> s
        elif e.name.startswith("cuda") and e.device_type == torch.autograd.DeviceType.CPU:
            runtime[e.name][0] += 1
            runtime[e.name][1] += e.time_range.elapsed_us() / 1e6
    stats = pstats.Stats(profiler).sort_stats("tottime")
    functions = sorted(
        ({"function": f"{Path(f).name}:{line}({name})", "calls": calls, "own_s": round(own, 3), "cum_s": round(cum, 3)}
         for (f, line, name), (_, calls, own, cum, _) in stats.stats.items()),
        key=lambda r: -r["own_s"],
    )[:top]  # fmt: skip
    loop_kernels = [k for k in kernels if k[0] >= kernels[-1][1] - row["loop_s"]] if kernels else []
    return row | {
        "kernel_s_sum": round(sum(b - a for a, b in kernels), 3),
        "gpu_busy_s": round(busy_union(kernels), 3),
        "gpu_busy_last_loop_s": round(busy_union(loop_kernels), 3),
        "cuda_runtime": {
            k: {"calls": n, "s": round(s, 3)} for k, (n, s) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]
        },
        "top_functions": functions,
    }


def warm(exp: Path, audio: Path, out: Path, overrides: list[str], sync_debug: bool) -> dict:
    """The same run again; with ``sync_debug``, where the host waited for the device (source lines, counts)."""
    if not (sync_debug and torch.cuda.is_available()):
        return timed_run(exp, audio, out, overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            row = timed_run(exp, audio, out, overrides)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return row | {"sync_points": dict(where.most_common(15))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="usm600m,tiny")
    p.add_argument("--hours", type=float, default=10.0)
    p.add_argument("--min-seconds", type=float, default=10.0)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--unique", type=int, default=256)
    p.add_argument("--blank-bias", type=float, default=8.0)
    p.add_argument("--corpus", help="an embedded-corpus folder (default: the tiny one, built into --work)")
    p.add_argument("--work", help="audio, checkpoints and outputs (default: a temporary folder)")
    p.add_argument(
        "--overrides", nargs="*", default=["compile=true", "batch_seconds=1920", "num_workers=12"],
        help="BatchConfig key=value for every run",
    )  # fmt: skip
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=True, help="profile the cold run (CUDA)")
    p.add_argument("--sync-debug", action=argparse.BooleanOptionalAction, default=True, help="in the warm run (CUDA)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--variant")
    p.add_argument("--cpu-plumbing", action="store_true")
    args = p.parse_args()
    if args.cpu_plumbing:
        args.hours, args.min_seconds, args.max_seconds, args.unique = 0.02, 5.0, 15.0, 8
        args.models, args.trace, args.sync_debug = "tiny", False, False
        args.variant = args.variant or "cpu_plumbing"
        args.overrides = ["device=cpu", "compile=false", "batch_seconds=60", "num_workers=1"]
    args.trace = args.trace and torch.cuda.is_available()
    work = tempfile.TemporaryDirectory(prefix="usmkit-profile-batch-") if not args.work else None
    args.work = args.work or work.name
    corpus = corpus_dir(args)
    audio, seconds, files = make_audio(args, corpus)
    print(f"{files} files, {seconds / 3600:.2f} h of audio", flush=True)
    rows = []
    for name in args.models.split(","):
        exp = random_checkpoint(name, args, corpus)
        out = Path(args.work) / f"profile_{name}.jsonl"
        row = {
            "model": name,
            "cold": cold(exp, audio, out, args.overrides, args.trace, args.top),
            "warm": warm(exp, audio, out, args.overrides, args.sync_debug),
        }
        rows.append(row)
        for run, r in (("cold", row["cold"]), ("warm", row["warm"])):
            ph = r["phases_s"]
            print(
                f"{name:>8} {run}: loop {r['loop_s']:.2f} s (RTFx {r['rtfx']:.0f}), {r['batches']} batches, first after "
                f"{r['first_batch_after_s']} s, {r['graphs_compiled_in_loop']} graphs compiled | loader wait "
                f"{r['loader_wait_s']:.2f} | launch {ph['launch']:.2f} (features {ph['features']:.2f}) | finish "
                f"{ph['finish']:.2f} (gpu wait {ph['gpu_wait']:.2f}, emit {ph['emit']:.2f}) | flush {ph['flush']:.2f} "
                f"| rest {r['rest_s']:.2f}",
                flush=True,
            )
        c = row["cold"]
        if "gpu_busy_s" in c:
            print(f"          cold: GPU busy {c['gpu_busy_last_loop_s']:.2f} s in the loop; runtime: "
                  + ", ".join(f"{k} {v['calls']}x {v['s']:.2f}s" for k, v in list(c["cuda_runtime"].items())[:8]))  # fmt: skip
            for f in c["top_functions"][:12]:
                print(f"            {f['own_s']:7.3f} s own {f['cum_s']:7.3f} cum {f['calls']:7d}x  {f['function']}")
        if "sync_points" in row["warm"]:
            print("          warm: host waited for the device at " + json.dumps(row["warm"]["sync_points"]))
    result = run_header(audio_hours=round(seconds / 3600, 3), files=files, overrides=args.overrides, rows=rows)
    path = write_result(result_path("profile_batch_transcribe", args.variant), result)
    print(f"wrote {path}")
    if work is not None:
        work.cleanup()


if __name__ == "__main__":
    main()
