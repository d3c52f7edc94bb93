"""``import usmkit`` leaves the process alone; every entry point sets OMP_WAIT_POLICY before torch is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Records OMP_WAIT_POLICY at the moment torch is first imported, then imports (does not run) one module,
# as ``python -m`` would: the package ``__init__`` files first, then the module's own imports.
PROBE = """
import importlib, os, sys
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = os.environ.get("OMP_WAIT_POLICY", "<unset>")
        return None
sys.meta_path.insert(0, Spy())
importlib.import_module(sys.argv[1])
print("at-torch-import", seen.get("torch", "<torch not imported>"))
print("after", os.environ.get("OMP_WAIT_POLICY", "<unset>"))
"""

# Each probe is a fresh interpreter importing torch (several seconds here): the default run keeps one of each
# kind (a plain module, a package's ``__main__``, the console script's module); the rest are marked slow.
ENTRY_MODULES = [
    "usmkit.cli.train",
    "usmkit.cli.prepare",
    "usmkit.cli.transcribe",  # the ``usmkit-transcribe`` console script imports its ``main`` from here
    *(
        pytest.param(m, marks=pytest.mark.slow)
        for m in (
            "usmkit.cli.evaluate",
            "usmkit.cli.demo",
            "usmkit.cli.average",
            "usmkit.cli.export",
            "usmkit.cli.serve",
            "usmkit.cli.tune_lexicon",
        )
    ),
]


def _probe(module: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def test_import_usmkit_has_no_side_effects():
    seen = _probe("usmkit")
    assert seen == {"at-torch-import": "<torch not imported>", "after": "<unset>"}


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_entry_point_sets_wait_policy_before_torch(module):
    seen = _probe(module)
    # usmkit.cli.demo only starts other entry points as subprocesses and never imports torch itself
    assert seen["at-torch-import"] in ("PASSIVE", "<torch not imported>"), seen
    assert seen["after"] == "PASSIVE"
