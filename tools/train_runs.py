"""The trainer run in the caller's process: its typed config for a few steps, and the last step a run logged."""

from __future__ import annotations

import json
import time
from pathlib import Path


def last_step(exp_dir: Path) -> int:
    """The last step a training run logged in its ``metrics.jsonl`` (below its ``trainer.max_steps`` when
    ``trainer.max_minutes`` stopped it)."""
    rows = [json.loads(x) for x in (Path(exp_dir) / "metrics.jsonl").read_text().splitlines()]
    return max((r["step"] for r in rows), default=0)


def bench_train_config(name: str, steps: int, overrides: list[str]):
    """The typed config and its YAML (what ``usmkit.training.recipe.run`` takes) of ``python -m usmkit.cli.train
    <overrides>`` run for ``steps`` steps with no evaluation, checkpoints or progress bar in a fresh
    ``/tmp/<name>_<time>``: for benchmarks that run the trainer in their own process."""
    import yaml

    from usmkit.cli.compose import compose_train
    from usmkit.config import TrainConfig, from_dict

    overrides = [*overrides, f"trainer.max_steps={steps}", "trainer.eval_every=0", "trainer.save_every=0",
                 "trainer.progress=false", f"trainer.exp_dir=/tmp/{name}_{int(time.time())}"]  # fmt: skip
    container = compose_train(overrides, command="bench")
    return from_dict(TrainConfig, container), yaml.safe_dump(container, sort_keys=False)
