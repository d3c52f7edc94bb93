"""bench/trainer_throughput.py's variant names: the eager and whole-scope variants that replaced trainer_compile.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import trainer_throughput as tt  # noqa: E402


def _overrides(name: str) -> list[str]:
    cmd = tt.command(
        name,
        argparse.Namespace(manifest_dir="data/synth", max_duration=0, num_workers=2, dry_run=False),
        Path("/tmp/x"),
    )
    return cmd[cmd.index("usmkit.cli.train") + 1 :]


def test_eager_and_whole_variants_set_the_trainer_keys():
    assert "trainer.compile=false" in _overrides("base_ea")
    assert "trainer.compile_scope=whole" not in _overrides("base_ea")
    whole = _overrides("base_wh")
    assert "trainer.compile=true" in whole and "trainer.compile_scope=whole" in whole
    plain = _overrides("base")
    assert "trainer.compile=true" in plain and not any(o.startswith("trainer.compile_scope") for o in plain)


def test_eager_refuses_compile_settings_and_unknown_flags_are_named():
    for bad in ("base_ea_cg", "base_ea_wh"):
        with pytest.raises(SystemExit, match="_ea trains eager"):
            tt.parse_variant(bad)
    with pytest.raises(SystemExit, match=r"\[_ea\]\[_wh\]"):
        tt.parse_variant("base_zz")
