"""``torchrun ... tests/training/dist_harness.py <train overrides>``: ``python -m usmkit.cli.train`` with faults
put into chosen processes, for the distributed tests. Set by environment variables:

- ``HARNESS_DELAY_RANK1_S``: rank 1 starts its setup this many seconds after the process group is up (it
  finds on disk what rank 0 already prepared, e.g. the tokenizer).
- ``HARNESS_SLOW_PREPARE_RANK0_S``: rank 0 takes this many seconds more to load the tokenizer.
- ``HARNESS_STALL_RANK1_AT_STEP``: rank 1 sleeps an hour before the forward of that step (1-based).
- ``HARNESS_KILL_RANK1_AT_STEP``: rank 1 kills itself (SIGKILL) before the forward of that step, in the
  first attempt of an elastic run only (``TORCHELASTIC_RESTART_COUNT=0``).
- ``HARNESS_EXIT_TIMES``: a folder where each process writes ``exit-rank<r>.txt``, the wall-clock time
  at which its interpreter ran its last exit handler.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import time
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


def main() -> None:
    exit_times = os.environ.get("HARNESS_EXIT_TIMES")
    if exit_times:  # registered first: atexit runs it last
        atexit.register(lambda: (Path(exit_times) / f"exit-rank{RANK}.txt").write_text(repr(time.time())))

    import torch.distributed as dist

    delay = _env_float("HARNESS_DELAY_RANK1_S")
    if delay and RANK == 1:
        init = dist.init_process_group

        def delayed_init(*args, **kwargs):
            init(*args, **kwargs)
            time.sleep(delay)

        dist.init_process_group = delayed_init

    slow = _env_float("HARNESS_SLOW_PREPARE_RANK0_S")
    if slow and RANK == 0:
        from usmkit.training import recipe

        load = recipe.load_tokenizer

        def slow_load(*args, **kwargs):
            time.sleep(slow)
            return load(*args, **kwargs)

        recipe.load_tokenizer = slow_load

    stall, kill = _env_float("HARNESS_STALL_RANK1_AT_STEP"), _env_float("HARNESS_KILL_RANK1_AT_STEP")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if RANK == 1 and (stall or (kill and first_attempt)):
        from usmkit.training.trainer import Trainer

        forward_backward = Trainer._forward_backward

        def faulty(self, batch, sync):
            if stall and self.step + 1 == stall:
                time.sleep(3600)
            if kill and first_attempt and self.step + 1 == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return forward_backward(self, batch, sync)

        Trainer._forward_backward = faulty

    sys.argv = ["usmkit.cli.train", *sys.argv[1:]]
    runpy.run_module("usmkit.cli.train", run_name="__main__")


if __name__ == "__main__":
    main()
