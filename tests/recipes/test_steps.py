"""usmkit.recipes.steps: a recipe's commands rendered from override dicts, run after their deps up to ``jobs`` at
a time, recorded once done so that a rerun skips them, refused when recorded with other arguments, and resumed
(``resume=true``) when a training step was stopped part way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from usmkit.recipes.steps import StageFailed, Step, parse_overrides, render, run_steps


def test_render_writes_hydra_overrides():
    assert render({"a.b": [0.9, 1.0], "m": {"d_model": 64, "x": True}, "n": None, "p": Path("a/b"), "s": "x y"}) == [
        "a.b=[0.9,1.0]",
        "m={d_model: 64, x: true}",
        "n=null",
        "p=a/b",
        "s='x y'",
    ]
    assert parse_overrides(["trainer.max_steps=5", "data.speed_perturb=[0.9,1.1]", "trainer.max_steps=6"]) == {
        "trainer.max_steps": 6,
        "data.speed_perturb": [0.9, 1.1],
    }
    with pytest.raises(ValueError, match="not an override"):
        parse_overrides(["trainer.max_steps"])


def _fake_steps(tmp_path, value=1, device="cpu"):
    return [
        Step("a", "usmkit.cli.prepare", {"out": tmp_path / "a"}, positional=("an4",)),
        Step(
            "b",
            "usmkit.cli.train",
            {"trainer.exp_dir": tmp_path / "b", "trainer.seed": value, "trainer.device": device},
            ("a",),
        ),
        Step("c", "usmkit.cli.train", {"trainer.exp_dir": tmp_path / "c"}, ("a",)),
        Step("d", "usmkit.cli.evaluate", lambda: {"x": (tmp_path / "b.out").read_text()}, ("b",)),
    ]


def test_steps_run_after_their_deps_once_and_are_skipped_when_recorded(tmp_path, capsys):
    ran = []

    def execute(step, argv):
        ran.append((step.name, argv))
        if step.name == "b":
            (tmp_path / "b.out").write_text("from-b")

    run_steps("train", _fake_steps(tmp_path), tmp_path, 2, execute)
    order = [name for name, _ in ran]
    assert sorted(order) == ["a", "b", "c", "d"] and order[0] == "a" and order.index("d") > order.index("b")
    assert dict(ran)["d"] == ["x=from-b"] and dict(ran)["a"][0] == "an4"
    assert json.loads((tmp_path / "steps" / "b.json").read_text())["argv"] == dict(ran)["b"]
    assert "ETA" in capsys.readouterr().out

    ran.clear()  # done is done wherever it runs next
    run_steps("train", _fake_steps(tmp_path, device="cuda"), tmp_path, 2, execute)
    assert ran == [] and "4 done before, 0 to run" in capsys.readouterr().out

    # A step recorded with other arguments is refused (and what needs it does not run); the others still run.
    (tmp_path / "steps" / "c.json").unlink()
    with pytest.raises(StageFailed, match=r"b: done before with other arguments \(trainer.seed: 1 -> 2\)"):
        run_steps("train", _fake_steps(tmp_path, value=2), tmp_path, 2, execute)
    assert [name for name, _ in ran] == ["c"]


def test_a_failed_step_stops_what_needs_it_only_and_an_interrupted_run_resumes(tmp_path):
    ran = []
    (tmp_path / "c" / "checkpoints" / "step-000002").mkdir(parents=True)  # c was stopped part way

    def execute(step, argv):
        ran.append((step.name, argv))
        if step.name == "b":
            raise RuntimeError("exit status 1")

    with pytest.raises(StageFailed) as failed:
        run_steps("train", _fake_steps(tmp_path), tmp_path, 1, execute)
    assert "b: exit status 1" in str(failed.value) and "d: not run: it needs b" in str(failed.value)
    assert [name for name, _ in ran] == ["a", "b", "c"] and dict(ran)["c"][-1] == "resume=true"
    assert json.loads((tmp_path / "steps" / "c.json").read_text())["argv"] == dict(ran)["c"][:-1]  # recorded without it
    assert not (tmp_path / "steps" / "b.json").exists()

    # An earlier stage's step that was never done: named, and nothing that needs it runs.
    later = Step("e", "usmkit.cli.evaluate", {"x": 1}, ("never",))
    with pytest.raises(StageFailed, match="e: not run: it needs never, not done"):
        run_steps("decode", [later], tmp_path, 1, execute)
