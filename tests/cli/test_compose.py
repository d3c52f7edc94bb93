"""usmkit.cli.compose: every ``python -m usmkit.cli.*`` command reads Hydra overrides, and a bad one is one
``error:`` line (a ConfigError, exit status 2) that names it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from usmkit.cli.compose import compose_dataclass, compose_train, compose_yaml
from usmkit.config import ConfigError, OptimConfig, TrainConfig, TrainerConfig, from_dict
from usmkit.inference.evaluate import EvalConfig


@dataclass(frozen=True)
class _Args:
    out: Path = Path("x")
    seed: int = 0
    force: bool = False


def test_dataclass_overrides_are_typed() -> None:
    args = compose_dataclass(_Args, ["out=/tmp/y", "seed=3", "force=true"], command="t", usage="USAGE")
    assert args == _Args(Path("/tmp/y"), 3, True)
    assert compose_dataclass(_Args, [], command="t", usage="USAGE") == _Args()


@pytest.mark.parametrize(
    ("bad", "named"),
    [(["seed=x"], "seed"), (["sead=1"], "did you mean seed"), (["seed"], "key=value"), (["--seed=1"], "--seed=1")],
)
def test_a_bad_override_is_a_config_error_naming_it(bad, named) -> None:
    with pytest.raises(ConfigError, match=named):
        compose_dataclass(_Args, bad, command="t", usage="USAGE")


def test_keys_of_a_nested_frozen_dataclass_are_settable() -> None:
    """``lexicon.order=1`` for the export, batch and pseudo-label commands: their ``LexiconConfig`` is a frozen
    dataclass inside another dataclass, whose config node was read-only."""
    from usmkit.cli.export import ExportArgs
    from usmkit.decoding.ctc_lexicon import LexiconConfig
    from usmkit.inference.batch_transcribe import BatchConfig
    from usmkit.inference.pseudo_label import PseudoLabelConfig

    for cls in (ExportArgs, BatchConfig, PseudoLabelConfig):
        cfg = compose_dataclass(cls, ["lexicon.order=1", "lexicon.lm_weight=0.5"], command="t", usage="USAGE")
        assert isinstance(cfg.lexicon, LexiconConfig)
        assert (cfg.lexicon.order, cfg.lexicon.lm_weight) == (1, 0.5)
        assert cfg.lexicon.beam_size == LexiconConfig().beam_size


def test_help_prints_the_usage(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        compose_dataclass(_Args, ["--help"], command="t", usage="USAGE TEXT")
    assert done.value.code == 0 and "USAGE TEXT" in capsys.readouterr().out


def test_train_config_composes_recipes_and_overrides() -> None:
    cfg = from_dict(TrainConfig, compose_train(["recipe=stage1", "trainer.max_steps=7"], command="t"))
    assert cfg.task.kind == "bestrq" and cfg.trainer.max_steps == 7
    assert cfg.trainer.exp_dir == "exp/stage1"  # each recipe names its folder


def test_the_train_yaml_starts_from_every_dataclass_default() -> None:
    """train.yaml holds no defaults of its own: a key no YAML sets composes to the dataclass's default, and
    is set like any other, without Hydra's ``+``."""
    from usmkit.cli.compose import _field_paths

    bare = from_dict(TrainConfig, compose_train(["recipe=stage3_ctc"], command="t"))
    assert bare.trainer == replace(TrainerConfig(), exp_dir="exp/stage3_ctc")
    assert bare.optim == OptimConfig() and bare.task.las == TrainConfig().task.las
    assert bare.data.allow_urls is False
    got = from_dict(TrainConfig, compose_train(["data.allow_urls=true", "task.las.dim=64"], command="t"))
    assert got.data.allow_urls is True and got.task.las.dim == 64
    assert "trainer.max_steps" in set(_field_paths(TrainConfig))


def test_a_schema_key_the_yaml_leaves_out_is_settable_without_plus() -> None:
    @dataclass(frozen=True)
    class _Evaluate(EvalConfig):
        extra: int = 0

    with pytest.raises(ConfigError, match="unknown key extra"):
        compose_yaml("evaluate", ["checkpoint=x", "extra=3"], command="t", schema=EvalConfig)
    got = compose_yaml("evaluate", ["checkpoint=x", "extra=3"], command="t", schema=_Evaluate)
    assert from_dict(_Evaluate, got).extra == 3


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["trainer.max_stepz=3"], "unknown key trainer.max_stepz .*did you mean trainer.max_steps"),
        (["recipe=nope"], "recipe/nope.*choose one of stage1, stage1_cpu, stage2"),
        (["model=huge"], "model=huge: no such encoder preset"),
        (["trainer.max_steps=[3"], "overrides look like key=value"),
    ],
)
def test_train_config_errors_name_the_override(bad, named) -> None:
    with pytest.raises(ConfigError, match=named):
        compose_train(bad, command="usmkit.cli.train")
