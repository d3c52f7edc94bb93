"""What every benchmark and study shares: the head of its JSON (command, device, date, torch) and where results go.

Each script writes ``<its folder>/results/<script>[_variant].json`` (``bench/results/`` for the suite,
``experiments/<study>/results/`` for a study) whose first keys come from ``run_header``, so
``bench/README.md`` and ``experiments/README.md`` can index every result by the command that made it,
the device and the date. Run scripts from the repository root: ``PYTHONPATH=. python bench/<script>.py ...``;
studies import this module as ``bench.common``.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def device_name() -> str:
    """The GPU's name where CUDA is available, else the CPU and its core count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def command() -> str:
    """The command line that is running, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_arg = str(script.relative_to(REPO))
    except ValueError:
        script_arg = sys.argv[0]
    return "PYTHONPATH=. python " + shlex.join([script_arg, *sys.argv[1:]])


def run_header(trained_on: str | None = None, **extra) -> dict:
    """The head of a benchmark's JSON: command, device, date (UTC) and torch version, then ``extra``.
    ``trained_on``: a study that combines runs made on another machine names that machine as ``device``, and
    this one as ``combined_on``."""
    import torch

    here = device_name()
    machine = {"device": trained_on, "combined_on": here} if trained_on else {"device": here}
    return {
        "command": command(),
        **machine,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        **extra,
    }


def result_path(script: str | os.PathLike, variant: str | None = None) -> Path:
    """``<folder>/results/<script>[_<variant>].json``: ``script`` is a bare name (a suite benchmark:
    ``bench/results/``) or a script's path, ``__file__`` (a study: the ``results/`` folder beside it).
    Under ``$OUT`` instead when set, as on the lent GPU machines."""
    script = Path(script)
    folder = RESULTS if script.parent == Path() else script.resolve().parent / "results"
    root = Path(os.environ["OUT"]) if os.environ.get("OUT") else folder
    name = script.stem + (f"_{variant}" if variant else "")
    return root / f"{name}.json"


def write_result(path: str | os.PathLike, result: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def last_step(exp_dir: Path) -> int:
    """The last step a training run logged in its ``metrics.jsonl`` (below its ``trainer.max_steps`` when
    ``trainer.max_minutes`` stopped it)."""
    rows = [json.loads(x) for x in (Path(exp_dir) / "metrics.jsonl").read_text().splitlines()]
    return max((r["step"] for r in rows), default=0)


def bench_train_config(name: str, steps: int, overrides: list[str]):
    """The typed config and its YAML (what ``usmkit.training.recipe.run`` takes) of ``python -m usmkit.cli.train
    <overrides>`` run for ``steps`` steps with no evaluation, checkpoints or progress bar in a fresh
    ``/tmp/<name>_<time>``: for benchmarks that run the trainer in their own process."""
    import time

    import yaml

    from usmkit.cli.compose import compose_train
    from usmkit.config import TrainConfig, from_dict

    overrides = [*overrides, f"trainer.max_steps={steps}", "trainer.eval_every=0", "trainer.save_every=0",
                 "trainer.progress=false", f"trainer.exp_dir=/tmp/{name}_{int(time.time())}"]  # fmt: skip
    container = compose_train(overrides, command="bench")
    return from_dict(TrainConfig, container), yaml.safe_dump(container, sort_keys=False)
