"""The configs documented commands compose (``usmkit.cli.train.composed``) against values pinned from the
code before the defaults moved into the dataclasses (tests/cli/documented_configs.json): the README's and
docs' commands on a GPU and bare on a CPU (the ``<recipe>_cpu`` settings), ``make demo``'s training run and
the AN4 recipe's training steps. A difference names the command and the keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from usmkit.cli.train import composed
from usmkit.config import TrainConfig, from_dict, to_dict

PINS = json.loads((Path(__file__).parent / "documented_configs.json").read_text())


def _flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and key != "overrides":
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", sorted(PINS["commands"]))
def test_a_documented_command_composes_the_config_it_always_did(name):
    pin = PINS["commands"][name]
    container, _ = composed(pin["argv"], has_gpu=pin["gpu"])
    got = _flat(json.loads(json.dumps(to_dict(from_dict(TrainConfig, container)))))  # tuples as JSON lists
    want = PINS["base"] | pin["differs"]
    differ = {k: (want.get(k, "-"), got.get(k, "-")) for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)}
    assert not differ, f"{name}: (pinned, now) {differ}"


# ---- the CPU settings of a bare headline command --------------------------------------------------------
RECIPES = ("stage1", "stage2", "stage3_joint", "stage3_ctc", "stage3_las")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_bare_recipe_on_a_cpu_runs_its_cpu_recipe_and_says_so(recipe):
    from usmkit.cli.train import cpu_note

    argv = [f"recipe={recipe}", "trainer.exp_dir=exp/x"]
    container, cpu = composed(argv, has_gpu=False)
    assert cpu == recipe
    cfg = from_dict(TrainConfig, container)
    assert cfg.trainer.max_steps < 1000 and cfg.trainer.exp_dir == "exp/x"
    assert cfg == from_dict(TrainConfig, composed([f"recipe={recipe}_cpu", "trainer.exp_dir=exp/x"], has_gpu=True)[0])
    note = cpu_note(recipe, cfg)
    assert f"recipe={recipe}_cpu" in note and "minutes" in note and "model.dropout=0.0" in note
    assert "model.overrides={subsampling_channels: 32}" in note


def test_the_default_recipe_counts_as_bare():
    assert composed([], has_gpu=False)[1] == "stage3_ctc"


@pytest.mark.parametrize(
    "argv, has_gpu",
    [
        (["recipe=stage1"], True),  # a GPU runs the recipe as written
        (["recipe=stage1", "model=small"], False),  # a configured run gets exactly what it names
        (["recipe=stage3_ctc", "trainer.max_steps=5"], False),
        (["recipe=stage3_ctc_cpu"], False),  # the CPU settings named: as they are
    ],
)
def test_no_cpu_settings_for_a_gpu_or_a_configured_run(argv, has_gpu):
    from usmkit.cli.train import cpu_recipe

    assert cpu_recipe(argv, has_gpu) is None


def test_model_names_a_preset_and_an_unknown_one_is_named():
    from usmkit.config import ConfigError

    cfg = from_dict(TrainConfig, composed(["recipe=stage1", "model=base"], has_gpu=True)[0])
    assert cfg.model.preset == "base"
    with pytest.raises(ConfigError, match="model=huge: no such encoder preset; choose one of tiny, small"):
        composed(["model=huge"], has_gpu=True)


def test_each_check_of_the_run_directory_runs_once_per_launch(monkeypatch, tmp_path):
    """``check_experiment_dir`` and ``check_resume_config`` run once, in the recipe's checks, before the log file
    is opened in the directory."""
    import logging
    import sys

    from usmkit.checkpointing.output_dir import check_experiment_dir
    from usmkit.cli import train
    from usmkit.training.recipe import TrainingRecipe
    from usmkit.training.resume_config import check_resume_config

    calls = []
    for original in (check_experiment_dir, check_resume_config):

        def counted(*args, _original=original, **kwargs):
            calls.append((_original.__name__, (tmp_path / "exp" / "train.log").exists()))
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):  # every module that imported it by name
            if getattr(module, original.__name__, None) is original:
                monkeypatch.setattr(module, original.__name__, counted)
    monkeypatch.setattr(TrainingRecipe, "run", lambda self: {})
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # setup_logging replaces them: restored after
    assert train.main(["recipe=stage3_ctc", f"trainer.exp_dir={tmp_path / 'exp'}", "trainer.device=cpu"]) == 0
    assert sorted(calls) == [("check_experiment_dir", False), ("check_resume_config", False)]
