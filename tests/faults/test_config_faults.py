"""Issue 40, case 15: Hydra's config errors are one ``error:`` line and exit status 2, like every other
user error; a key the typed config has (``data.allow_urls``) is settable without Hydra's ``+``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("command", "override", "named"),
    [
        ("usmkit.cli.train", "trainer.max_stepz=3", "unknown key trainer.max_stepz"),
        ("usmkit.cli.train", "recipe=stage9", "choose one of stage1"),
        ("usmkit.cli.train", "trainer.max_steps=many", "trainer.max_steps"),
        ("usmkit.cli.train", "trainer.max_steps=[3", "overrides look like key=value"),
        ("usmkit.cli.evaluate", "decodee=ctc_greedy", "unknown key decodee"),
        ("usmkit.cli.export", "formats=onnx", "unknown key formats"),
    ],
)
def test_config_errors_are_one_line_and_exit_2(tmp_path, command, override, named):
    proc = _run(command, override, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr


def test_documented_data_allow_urls_is_accepted(tmp_path):
    proc = _run("usmkit.cli.train", "data.allow_urls=true", "trainer.max_steps=0", "--cfg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "allow_urls: true" in proc.stdout
