"""Where the GPU idles while the trainer trains: a profiler trace of real steps, each idle gap put down to
what the host was doing when it launched the work that ended the gap.

    PYTHONPATH=. python experiments/trainer_gaps/trainer_gaps.py [--skip 40] [--steps 8] [--json OUT] [--trace OUT.json] -- OVERRIDE...
    e.g. -- recipe=stage3_ctc model=large data.manifest_dir=data/synth data.max_duration=300 \\
            data.pad_to_frames=256 trainer.compile=true trainer.precision=bf16

Runs ``usmkit.training.recipe.run`` in this process. After ``--skip`` steps (compiling the padded lengths) and two
warm-up steps, ``--steps`` steps run under ``torch.profiler`` (CPU and CUDA). From the trace:

- ``busy``: the share of the profiled steps' wall time with a kernel, copy or memset running on the GPU
  (the union of their intervals), the same quantity ``nvidia-smi``'s utilization samples;
- ``host_ms_per_step_by_phase``: the host's wall time in each phase;
- ``gaps``: every idle interval between them, put down to (a) the trainer's phase the host was in when it
  launched the work that ended the gap (``next_batch``: taking the loader's next batch; ``forward_backward``;
  ``settle``: reading an earlier step's loss; those ``--annotate`` names, innermost first; ``other``: gradient
  clipping, the optimizer, logging), and
  (b) the innermost operator on the launching thread (the autograd thread launches the backward); and
  (c) the phase the host was in when the GPU went idle (``gap_ms_by_phase_at_gap_start``: a gap that opens
  while the host takes the next batch and closes with that batch's copy is the loader's).

A gap the host ends late is launch-bound time (Python, dispatch, compiled-graph guards between kernels);
one behind a ``cudaStreamSynchronize`` / device-to-host copy is the host waiting and then refilling.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import tempfile
import time
from pathlib import Path

from tools.results import run_header, write_result
from tools.train_runs import bench_train_config

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
MIN_GAP_US = 5.0  # shorter idle intervals are the launch queue's normal spacing, not counted as gaps


def _union(intervals: list[tuple[float, float]]) -> list[list[float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _innermost(spans: list[tuple[float, float, str]], starts: list[float], t: float) -> str | None:
    """The shortest span (start, end, name) holding time ``t``; ``spans`` sorted by start, ``starts`` their starts."""
    best = None
    last = bisect.bisect_right(starts, t) - 1
    for i in range(last, max(last - 2000, -1), -1):  # the innermost span starts shortly before t
        start, end, name = spans[i]
        if t <= end and (best is None or end - start < best[1] - best[0]):
            best = (start, end, name)
    return best[2] if best else None


def analyse(events: list[dict], min_gap_us: float = MIN_GAP_US) -> dict:
    """Busy share and attributed idle gaps of a Chrome trace's events (``torch.profiler`` export).

    The window runs from the host's first ``ProfilerStep#`` annotation's start to its last one's end; a
    gap is an interval of at least ``min_gap_us`` in it with no device activity."""
    steps = [  # the host's step annotations (the trace repeats each on the GPU's timeline: gpu_user_annotation)
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    if not steps:
        raise ValueError("no ProfilerStep# annotation in the trace: were the profiled steps reached?")
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    device = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and e["ts"] < hi and e["ts"] + e["dur"] > lo
    ]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    ops_by_tid: dict[object, list[tuple[float, float, str]]] = collections.defaultdict(list)
    phase_spans: list[tuple[float, float, str]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "cpu_op":
            ops_by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("usmkit."):
            phase_spans.append((e["ts"], e["ts"] + e["dur"], e["name"].removeprefix("usmkit.")))
    for spans in ops_by_tid.values():
        spans.sort()
    op_starts = {tid: [s[0] for s in spans] for tid, spans in ops_by_tid.items()}
    phase_spans.sort()
    phase_starts = [s[0] for s in phase_spans]

    busy = _union([(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in device])
    busy_us = sum(end - start for start, end in busy)
    first_after = sorted((e["ts"], e) for e in device)
    first_ts = [t for t, _ in first_after]
    host_ms: collections.Counter[str] = collections.Counter()  # each phase's host time in the window
    for start, end, name in phase_spans:
        host_ms[name] += max(0.0, min(end, hi) - max(start, lo)) / 1e3
    by_phase: collections.Counter[str] = collections.Counter()
    by_phase_at_start: collections.Counter[str] = collections.Counter()  # what the host was in as the GPU went idle
    by_op: collections.Counter[str] = collections.Counter()
    by_kernel: collections.Counter[str] = collections.Counter()
    late = 0.0  # gap time whose ending work was launched after the GPU had gone idle
    n_gaps = 0
    edges = [lo, *[x for span in busy for x in span], hi]
    for gap_start, gap_end in zip(edges[::2], edges[1::2], strict=True):
        gap = gap_end - gap_start
        if gap < min_gap_us:
            continue
        n_gaps += 1
        by_phase_at_start[_innermost(phase_spans, phase_starts, gap_start) or "other"] += gap
        i = bisect.bisect_left(first_ts, gap_end - 1e-3)
        nxt = first_after[i][1] if i < len(first_after) else None
        launch = launches.get(nxt["args"].get("correlation")) if nxt is not None else None
        if launch is None:
            by_phase["(end of window)" if nxt is None else "(no launch record)"] += gap
            continue
        at = launch["ts"]
        if at > gap_start:
            late += gap
        phase = _innermost(phase_spans, phase_starts, at) or "other"
        op = _innermost(ops_by_tid.get(launch["tid"], []), op_starts.get(launch["tid"], []), at) or launch["name"]
        by_phase[phase] += gap
        by_op[op] += gap
        by_kernel[nxt["name"][:80]] += gap
    window = hi - lo
    top = lambda c: {k: round(v / 1e3, 3) for k, v in c.most_common(12)}  # noqa: E731  ms
    return {
        "steps": len(steps),
        "window_ms": round(window / 1e3, 2),
        "step_ms": round(window / 1e3 / len(steps), 2),
        "busy": round(busy_us / window, 4),
        "idle_ms_per_step": round((window - busy_us) / 1e3 / len(steps), 2),
        "gaps_per_step": round(n_gaps / len(steps), 1),
        "host_ms_per_step_by_phase": {k: round(v / len(steps), 2) for k, v in host_ms.most_common()},
        "gap_ms_launched_late": round(late / 1e3, 3),
        "gap_ms_by_phase": top(by_phase),
        "gap_ms_by_phase_at_gap_start": top(by_phase_at_start),
        "gap_ms_by_launching_op": top(by_op),
        "gap_ms_by_next_kernel": top(by_kernel),
    }


def _annotate(target: str, record_function) -> None:
    """Wrap ``module:attr[.attr]`` (a function or a method) in ``record_function("usmkit.<last attr>")``."""
    import functools
    import importlib

    module_name, _, path = target.partition(":")
    *owners, name = path.split(".")
    owner = importlib.import_module(module_name)
    for attr in owners:
        owner = getattr(owner, attr)
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*a, **k):
        with record_function(f"usmkit.{name}"):
            return fn(*a, **k)

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", type=int, default=40, help="steps before profiling (compiling the padded lengths)")
    ap.add_argument("--steps", type=int, default=8, help="profiled steps")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--trace", type=Path, default=None, help="keep the Chrome trace here")
    ap.add_argument(
        "--annotate",
        nargs="*",
        default=[],
        metavar="MODULE:ATTR",
        help="more phases: functions or methods to time by name, e.g. usmkit.ssl.most:forced_durations "
        "(the name the caller looks up) or usmkit.ssl.most:MostModel._text_loss",
    )
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from usmkit.training import trainer as trainer_module
    from usmkit.training.recipe import run

    warmup = 2
    cfg, config_yaml = bench_train_config("trainer_gaps", args.skip + warmup + args.steps + 1, args.overrides)
    if cfg.optim.accum_steps != 1:
        raise SystemExit("trainer_gaps counts one forward-backward per step: run it with optim.accum_steps=1")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    trace = args.trace or Path(tempfile.mkdtemp(prefix="trainer_gaps_")) / "trace.json"
    prof = profile(
        activities=activities,
        schedule=schedule(wait=args.skip, warmup=warmup, active=args.steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    )
    Trainer = trainer_module.Trainer
    forward_backward, settle, batches = Trainer._forward_backward, Trainer._settle, Trainer._batches

    def annotated_forward_backward(self, batch, sync):
        prof.step()  # one step per call (accum_steps=1): ProfilerStep#N spans a whole training step
        with record_function("usmkit.forward_backward"):
            return forward_backward(self, batch, sync)

    def annotated_settle(self, *a, **k):
        with record_function("usmkit.settle"):
            return settle(self, *a, **k)

    def annotated_batches(self):
        it = batches(self)
        while True:
            with record_function("usmkit.next_batch"):
                batch = next(it, None)
            if batch is None:
                return
            yield batch

    Trainer._forward_backward, Trainer._settle, Trainer._batches = (
        annotated_forward_backward, annotated_settle, annotated_batches,
    )  # fmt: skip
    for target in args.annotate:
        _annotate(target, record_function)
    t0 = time.perf_counter()
    prof.start()
    try:
        run(cfg, config_yaml)
    finally:
        prof.stop()
    elapsed = time.perf_counter() - t0
    events = json.loads(trace.read_text())["traceEvents"]
    result = analyse(events)
    print(f"{result['steps']} steps of {result['step_ms']} ms: GPU busy {result['busy']:.1%}, "
          f"idle {result['idle_ms_per_step']} ms per step in {result['gaps_per_step']} gaps "
          f"({result['gap_ms_launched_late'] / max(result['window_ms'], 1e-9):.1%} of the time launched late)")  # fmt: skip
    print(f"\n{'host ms':>9s}  phase (per step)")
    for name, ms in result["host_ms_per_step_by_phase"].items():
        print(f"{ms:9.2f}  {name}")
    for key in ("gap_ms_by_phase", "gap_ms_by_phase_at_gap_start", "gap_ms_by_launching_op", "gap_ms_by_next_kernel"):
        print(f"\n{'idle ms':>9s}  {key.removeprefix('gap_ms_by_')} (over {result['steps']} steps)")
        for name, ms in result[key].items():
            print(f"{ms:9.2f}  {name}")
    if args.json:
        write_result(
            args.json, run_header(overrides=args.overrides, skip=args.skip, wall_s=round(elapsed, 1), **result)
        )


if __name__ == "__main__":
    main()
