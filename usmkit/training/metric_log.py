"""Where a run's scalars go: TensorBoard and ``metrics.jsonl`` in the experiment directory (main process)."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from usmkit.checkpointing.atomic import disk_full_is_one_line, replaced_atomically

log = logging.getLogger(__name__)

_TODO = "the checkpoints written so far are intact. Free disk space, then resume with resume=true"


class MetricLog:
    """TensorBoard scalars and one JSON line per logged step. A run resumed at ``start_step`` first drops
    the entries a killed run logged after it (they are logged again)."""

    def __init__(self, exp_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A full disk is one line (usmkit.checkpointing.atomic.WriteError), here and in write/close.
        self.full = functools.partial(disk_full_is_one_line, exp_dir, f"the metrics in {exp_dir}", _TODO)
        with self.full():
            exp_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(exp_dir / "tensorboard"), purge_step=start_step or None)
            dropped = truncate_metrics(exp_dir / "metrics.jsonl", start_step)
            if dropped:
                log.info("metrics.jsonl: removed %d entries after step %d (they are logged again)", dropped, start_step)
            self.lines = open(exp_dir / "metrics.jsonl", "a")  # noqa: SIM115  (closed by close())

    def write(self, scalars: dict[str, float], step: int) -> None:
        with self.full():
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, step)
            self.lines.write(json.dumps({"step": step, **scalars}) + "\n")
            self.lines.flush()

    def close(self) -> None:
        with self.full():
            try:
                self.writer.close()
            finally:
                self.lines.close()


def truncate_metrics(path: Path, step: int) -> int:
    """Remove the entries of ``metrics.jsonl`` logged after ``step`` (atomically); returns how many.
    Lines that are not JSON (a write cut short by a kill) are removed too."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
            keep = int(entry["step"]) <= step
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        with replaced_atomically(path) as tmp:
            tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    return dropped
