"""``python -m usmkit.cli.train <overrides>``'s configuration, composed in the test process."""

from __future__ import annotations

import yaml

from usmkit.cli.compose import compose_train
from usmkit.config import TrainConfig, from_dict


def train_config(*overrides: str) -> tuple[TrainConfig, str]:
    """The typed config and its YAML (what ``usmkit.training.recipe.run`` takes), from Hydra overrides."""
    container = compose_train(list(overrides), command="tests")
    return from_dict(TrainConfig, container), yaml.safe_dump(container, sort_keys=False)
