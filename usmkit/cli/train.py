"""``python -m usmkit.cli.train recipe=stage3_ctc [model=small] [trainer.max_steps=...]``: train.

Hydra composes ``usmkit/conf/train.yaml`` with the chosen recipe and overrides (``usmkit.cli.compose``);
the composed config is converted to ``TrainConfig`` once, here, and everything below sees only
dataclasses (``usmkit.training.recipe``). Several processes: ``torchrun --nproc-per-node 2 -m
usmkit.cli.train recipe=...`` (DDP; gloo on CPU); ``trainer.strategy=fsdp`` shards the model over them
(torchrun also for one process).

A headline command run as it is (``recipe=stage1|stage2|stage3_joint|stage3_ctc|stage3_las`` and nothing but
where it reads and writes) on a machine without a GPU would take hours with the recipe's full settings: it
runs ``recipe=<recipe>_cpu`` instead (``usmkit/conf/recipe/<recipe>_cpu.yaml``, settings useful in minutes
on two cores) and says so. Naming any other setting runs the recipe as written.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml

from usmkit.cli.compose import CONF_DIR, compose_train
from usmkit.cli.logs import setup_logging
from usmkit.config import TrainConfig, from_dict
from usmkit.errors import debug_enabled, strip_debug_flag, user_errors
from usmkit.training.recipe import TrainingRecipe

COMMAND = "usmkit.cli.train"
# Keys that do not make a run "configured": which recipe, where from, where to.
PLAIN_KEYS = ("recipe", "init_from", "trainer.exp_dir", "data.manifest_dir", "resume", "hydra.", "+hydra.")
# The recipes with CPU settings (conf/recipe/<recipe>_cpu.yaml), and their seconds per step on a 2-core CPU.
CPU_SECONDS_PER_STEP = {"stage1": 0.4, "stage2": 0.8, "stage3_joint": 0.4, "stage3_ctc": 0.25, "stage3_las": 0.32}


def cpu_recipe(argv: Sequence[str], has_gpu: bool) -> str | None:
    """The recipe whose CPU settings a bare headline command gets on a machine without a GPU, else None."""
    recipe = next((a.split("=", 1)[1] for a in argv if a.startswith("recipe=")), "stage3_ctc")
    bare = all(a.startswith(PLAIN_KEYS) for a in argv if "=" in a)
    return recipe if not has_gpu and bare and recipe in CPU_SECONDS_PER_STEP else None


def composed(argv: Sequence[str], has_gpu: bool) -> tuple[dict, str | None]:
    """The config ``argv`` composes on this machine, and the recipe whose CPU settings it got (None: none)."""
    cpu = cpu_recipe(argv, has_gpu)
    return compose_train(with_cpu_recipe(argv, cpu) if cpu else argv, command=COMMAND), cpu


def with_cpu_recipe(argv: Sequence[str], recipe: str) -> list[str]:
    """``argv`` with ``recipe=<recipe>_cpu`` in place of ``recipe=<recipe>``."""
    return [a for a in argv if not a.startswith("recipe=")] + [f"recipe={recipe}_cpu"]


def cpu_note(recipe: str, cfg: TrainConfig) -> str:
    """The line a bare command on a CPU prints: which settings it runs with and for about how long."""
    path = CONF_DIR / "recipe" / f"{recipe}_cpu.yaml"
    settings = _flat({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"})
    minutes = cfg.trainer.max_steps * CPU_SECONDS_PER_STEP[recipe] / 60
    return (
        f"no GPU here: {recipe} runs with CPU settings, recipe={recipe}_cpu (about {minutes:.0f} minutes on 2 cores): "
        f"{' '.join(settings)}. Name any setting on the command line to run the recipe as written."
    )


def _flat(node: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict) and key != "overrides":
            out += _flat(value, f"{prefix}{key}.")
        else:
            text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
            out.append(f"{prefix}{key}={text}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    # A bad value or file: one line and exit code 2 (--debug: the traceback). SIGINT or SIGTERM during the
    # steps: the trainer saves the step and ends with one line (exit 130 / 143, usmkit.training.stop_signals).
    with user_errors():
        container, cpu = composed(argv, torch.cuda.is_available())
        cfg = from_dict(TrainConfig, container)  # every value checked here, before any data is read
        if cpu:  # a bare headline command on a CPU: minutes, not hours (printed, and saved with the config)
            print(cpu_note(cpu, cfg), file=sys.stderr, flush=True)
        # Every setting checked against the others and the machine, trainer.exp_dir included (not other work; on
        # resume, the same model and task), before the log file is opened in it.
        recipe = TrainingRecipe(cfg, yaml.safe_dump(container, sort_keys=False))
        setup_logging(Path(cfg.trainer.exp_dir) / "train.log")
        try:
            recipe.run()
        except KeyboardInterrupt:  # before the first step, or a second Ctrl-C during one
            if debug_enabled():
                raise
            print(
                f"error: interrupted before a checkpoint could be saved; the checkpoints in {cfg.trainer.exp_dir} "
                "are intact: run the same command with resume=true to continue from the last one",
                file=sys.stderr,
            )
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
