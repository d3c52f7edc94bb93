"""Log lines of the ``python -m usmkit.cli.*`` commands: to stdout, and for training also to
``<exp_dir>/train.log`` (rank 0), in the format Hydra's job logging used."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class StdoutHandler(logging.StreamHandler):
    """Writes to the ``sys.stdout`` of the moment, not the one at setup: a caller (a test, a notebook) may
    replace and close it, and a record logged later must not go to the closed one."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


def setup_logging(log_file: Path | None = None) -> None:
    """INFO and above to stdout; also to ``log_file`` (appended) on rank 0 of a distributed run."""
    handlers: list[logging.Handler] = [StdoutHandler()]
    if log_file is not None and os.environ.get("RANK", "0") == "0":
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, format=FORMAT, handlers=handlers, force=True)
