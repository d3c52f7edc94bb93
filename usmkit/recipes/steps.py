"""A recipe's commands as steps: built from override dicts, run after what they need, each recorded once done
so that a rerun skips it (``recipes/an4/run.py`` is one such recipe).

    step = Step("scratch_s0", "usmkit.cli.train", {"recipe": "stage3_ctc", "trainer.seed": 0}, deps=("prep",))
    run_steps("train", [step, ...], out=Path("exp/an4_recipe"), jobs=4, execute=subprocess_runner(out, 4))

A step is ``python -m <module> [<positional> ...] key=value ...``. Its record, ``OUT/steps/<name>.json``,
holds the arguments it ran with; a step recorded with the same arguments (the device and loader workers
aside) is skipped, one recorded with others is refused (its outputs are of another command). A training
step (``trainer.exp_dir=``) whose folder holds a checkpoint but no record was stopped part way: it goes on
with ``resume=true``. Steps whose deps are done run side by side, up to ``jobs`` at a time."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from usmkit.checkpointing.atomic import replaced_atomically

Execute = Callable[["Step", list[str]], None]  # runs one step's command; raises if it fails


def render(overrides: Mapping[str, Any]) -> list[str]:
    """``{"trainer.seed": 1, "data.speed_perturb": []}`` -> ``["trainer.seed=1", "data.speed_perturb=[]"]``."""
    return [f"{key}={_value(value)}" for key, value in overrides.items()]


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list | tuple):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    text = str(v)
    if re.fullmatch(r"[\w./:+\-@~]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"  # Hydra's quoted string


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[x]"]`` -> ``{"a.b": 1, "c": ["x"]}`` (values read as YAML); a later key wins."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not an override: write key=value")
        out[key] = yaml.safe_load(value) if value else ""
    return out


@dataclass(frozen=True)
class Step:
    """One command, ``python -m <module> [<positional> ...] <overrides>``, run once its ``deps`` (step names)
    are done. ``overrides`` may be a function, called when the step starts (it reads an earlier step's output)."""

    name: str
    module: str
    overrides: Mapping[str, Any] | Callable[[], Mapping[str, Any]]
    deps: tuple[str, ...] = ()
    positional: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [*self.positional, *render(self.overrides() if callable(self.overrides) else self.overrides)]


class StageFailed(Exception):
    """Steps of a stage failed or could not run; the message lists each with why."""


def record_path(out: Path, name: str) -> Path:
    return out / "steps" / f"{name}.json"


def run_steps(stage: str, steps: Sequence[Step], out: Path, jobs: int, execute: Execute) -> None:
    """Run ``steps``, each once its deps are done, up to ``jobs`` at a time, and record each that succeeds;
    skip those recorded with the same arguments. A dep that is not one of ``steps`` must be recorded (an
    earlier stage's step). Failed steps, and the steps after them, are reported together at the end
    (``StageFailed``); the others still run."""
    jobs = max(1, jobs)
    pending, names = list(steps), {step.name for step in steps}
    done = {d for step in steps for d in step.deps if d not in names and record_path(out, d).is_file()}
    failed: dict[str, str] = {}
    todo = sum(not record_path(out, step.name).is_file() for step in steps)
    print(f"[{stage}] {len(steps)} steps: {len(steps) - todo} done before, {todo} to run, {jobs} at a time", flush=True)
    start, finished = time.time(), 0
    running: dict[cf.Future, tuple[Step, list[str], float]] = {}
    with cf.ThreadPoolExecutor(jobs) as pool:
        while pending or running:
            before = len(pending)
            for step in list(pending):
                blocked = [d for d in step.deps if d in failed or (d not in names and d not in done)]
                if blocked:
                    pending.remove(step)
                    failed[step.name] = f"not run: it needs {', '.join(blocked)}, not done"
                elif all(d in done for d in step.deps) and len(running) < jobs:
                    pending.remove(step)
                    try:
                        argv = step.argv()
                        if recorded(out, step, argv):
                            done.add(step.name)
                            continue
                    except Exception as e:  # noqa: BLE001  (a record of another command, a missing input)
                        failed[step.name] = str(e)
                        continue
                    running[pool.submit(execute, step, resumed(argv))] = (step, argv, time.time())
            if not running:
                if len(pending) == before:  # nothing can start: deps that never come
                    failed |= {step.name: "its deps never finish" for step in pending}
                    pending.clear()
                continue
            complete, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in complete:
                step, argv, began = running.pop(future)
                try:
                    future.result()
                except Exception as e:  # noqa: BLE001  (reported with the others at the end)
                    failed[step.name] = str(e)
                    print(f"[{stage}] {step.name} FAILED: {str(e).splitlines()[0]}", flush=True)
                    continue
                write_record(out, step, argv, (time.time() - began) / 60)
                done.add(step.name)
                finished += 1
                per, left = (time.time() - start) / finished, max(todo - finished - len(failed), 0)
                print(
                    f"[{stage}] {finished}/{todo} done ({step.name}); {per / 60:.1f} min a step, "
                    f"ETA {per * left / 60:.1f} min",
                    flush=True,
                )
    if failed:
        lines = "\n".join(f"  {name}: {why}" for name, why in failed.items())
        raise StageFailed(f"{stage}: {len(failed)} of {len(steps)} steps failed or could not run:\n{lines}")


def recorded(out: Path, step: Step, argv: list[str]) -> bool:
    """Whether ``step`` was done with ``argv`` before (where it ran aside: ``PLACEMENT``); a record of other
    arguments is refused, naming what differs."""
    path = record_path(out, step.name)
    if not path.is_file():
        return False
    before, now_ = _settings(json.loads(path.read_text())["argv"]), _settings(argv)
    if before != now_:
        changed = [
            f"{k}: {before.get(k, '-')} -> {now_.get(k, '-')}"
            for k in sorted(set(before) | set(now_))
            if before.get(k) != now_.get(k)
        ]
        raise StageFailed(
            f"done before with other arguments ({'; '.join(changed[:4])}): remove {path} and the step's "
            "outputs to redo it, or use another output folder"
        )
    return True


PLACEMENT = ("device", "trainer.device", "data.num_workers")  # where and how fast a step runs, not what it makes


def _settings(argv: list[str]) -> dict[str, str]:
    """``argv`` as {key: value} (a positional argument is its own key), without the ``PLACEMENT`` keys."""
    pairs = (a.split("=", 1) if "=" in a else (a, "") for a in argv)
    return {k: v for k, v in pairs if k not in PLACEMENT}


def resumed(argv: list[str]) -> list[str]:
    """``argv`` with ``resume=true`` when it trains into a folder that holds a checkpoint already (a run
    stopped part way, not recorded as done)."""
    exp = next((a.split("=", 1)[1] for a in argv if a.startswith("trainer.exp_dir=")), None)
    if exp and any((Path(exp) / "checkpoints").glob("step-*")):
        return [*argv, "resume=true"]
    return argv


def write_record(out: Path, step: Step, argv: list[str], minutes: float) -> None:
    record = {"module": step.module, "argv": argv, "minutes": round(minutes, 2), "finished": now()}
    with replaced_atomically(record_path(out, step.name)) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def subprocess_runner(out: Path, jobs: int) -> Execute:
    """``execute(step, argv)``: ``python -m <step.module> <argv>``, printed, its output in ``OUT/logs/<step>.log``;
    raises with the log's last lines if it fails. With several steps side by side each gets a share of the
    CPU's threads (``OMP_NUM_THREADS``, unless set)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    t0 = time.time()

    def execute(step: Step, argv: list[str]) -> None:
        print(f"[{(time.time() - t0) / 60:5.1f} min] $ python -m {step.module} {shlex.join(argv)}", flush=True)
        log = out / "logs" / f"{step.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, "-m", step.module, *argv], stdout=f, stderr=subprocess.STDOUT, env=env
            )
        if proc.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
            raise StageFailed(f"exit status {proc.returncode} (log {log}):\n{tail}")

    return execute
