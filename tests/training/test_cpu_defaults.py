"""The CPU settings a bare headline command gets (usmkit/cpu_defaults.py)."""

from __future__ import annotations

import pytest

from usmkit.training.cpu_defaults import CPU_RECIPES, cpu_overrides


@pytest.mark.parametrize("recipe", sorted(CPU_RECIPES))
def test_a_bare_recipe_on_a_cpu_gets_minutes_long_settings(recipe):
    extra, note = cpu_overrides([f"recipe={recipe}", "trainer.exp_dir=exp/x"], has_gpu=False)
    assert extra == list(CPU_RECIPES[recipe][0]) and any(e.startswith("trainer.max_steps=") for e in extra)
    assert note is not None and recipe in note and "minutes" in note


def test_the_default_recipe_counts_as_bare():
    assert cpu_overrides([], has_gpu=False)[0] == list(CPU_RECIPES["stage3_ctc"][0])


@pytest.mark.parametrize(
    "argv, has_gpu",
    [
        (["recipe=stage1"], True),  # a GPU runs the recipe as written
        (["recipe=stage1", "model=small"], False),  # a configured run gets exactly what it names
        (["recipe=stage3_ctc", "trainer.max_steps=5"], False),
        (["recipe=unknown"], False),
    ],
)
def test_no_cpu_settings_for_a_gpu_or_a_configured_run(argv, has_gpu):
    assert cpu_overrides(argv, has_gpu) == ([], None)
