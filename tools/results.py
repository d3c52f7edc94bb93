"""The head of a benchmark's or study's JSON (command, device, date, torch) and where results go.

Each script writes ``<its folder>/results/<script>[_variant].json`` (``bench/results/`` for the suite,
``experiments/<study>/results/`` for a study) whose first keys come from ``run_header``, so
``bench/README.md`` and ``experiments/README.md`` can index every result by the command that made it,
the device and the date. Run scripts from the repository root: ``PYTHONPATH=. python bench/<script>.py ...``.
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
