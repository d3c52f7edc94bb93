"""``python -m usmkit.cli.train recipe=stage3_ctc [model=small] [trainer.max_steps=...]``: train.

Hydra composes ``usmkit/conf/train.yaml`` with the chosen recipe and overrides (``usmkit.cli.compose``);
the composed config is converted to ``TrainConfig`` once, here, and everything below sees only
dataclasses (``usmkit.training.recipe``). Several processes: ``torchrun --nproc-per-node 2 -m
usmkit.cli.train recipe=...`` (DDP; gloo on CPU); ``trainer.strategy=fsdp`` shards the model over them
(torchrun also for one process).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml

from usmkit.checkpointing.output_dir import check_experiment_dir
from usmkit.cli.compose import compose_yaml
from usmkit.cli.logs import setup_logging
from usmkit.config import TrainConfig, from_dict
from usmkit.errors import debug_enabled, strip_debug_flag, user_errors
from usmkit.training.cpu_defaults import cpu_overrides
from usmkit.training.recipe import run
from usmkit.training.resume_config import check_resume_config

COMMAND = "usmkit.cli.train"


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    # A bad value or file: one line and exit code 2 (--debug: the traceback). SIGINT or SIGTERM during the
    # steps: the trainer saves the step and ends with one line (exit 130 / 143, usmkit.training.stop_signals).
    with user_errors():
        extra, note = cpu_overrides(argv, torch.cuda.is_available())
        if note:  # a bare headline command on a CPU: minutes, not hours (printed, and saved with the config)
            print(note, file=sys.stderr, flush=True)
        container = compose_yaml("train", [*argv, *extra], command=COMMAND, schema=TrainConfig)
        cfg = from_dict(TrainConfig, container)  # every value checked here, before any data is read
        check_experiment_dir(Path(cfg.trainer.exp_dir))  # before the log file is opened in it
        check_resume_config(cfg)
        setup_logging(Path(cfg.trainer.exp_dir) / "train.log")
        try:
            run(cfg, yaml.safe_dump(container, sort_keys=False))
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
