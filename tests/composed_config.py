"""``python -m usmkit.cli.train <overrides>``'s configuration, composed in the test process."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from usmkit.config import TrainConfig, from_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "usmkit" / "conf"


def train_config(*overrides: str) -> tuple[TrainConfig, str]:
    """The typed config and its YAML (what ``usmkit.training.recipe.run`` takes), from Hydra overrides."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        dcfg = compose("train", overrides=list(overrides))
    container = OmegaConf.to_container(dcfg, resolve=True)
    return from_dict(TrainConfig, container), OmegaConf.to_yaml(container)
