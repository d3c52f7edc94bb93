"""A clean stop of training on SIGINT (Ctrl-C) or SIGTERM (``kill``, a job scheduler's time limit).

While ``StopSignals`` is entered (``Trainer.fit``), either signal only records itself: the loop finishes
the step it is in, saves a checkpoint and raises ``TrainingInterrupted``, whose exit code is the shell's
for that signal (130 for SIGINT, 143 for SIGTERM). A second SIGINT stops at once (``KeyboardInterrupt``);
the last checkpoint on disk stays intact. The handler says it got the signal with one raw write to stderr and
never through ``logging``: a signal lands between any two bytecodes, also inside a log handler's write, and
logging from there re-enters that handler's stream (``RuntimeError: reentrant call``, printed as a "Logging
error" traceback). Under torchrun a Ctrl-C reaches each worker twice, from the
terminal and passed on by torchrun a moment later: a second SIGINT within ``FORWARDED_WITHIN_S`` of the first
is that copy, not a second Ctrl-C. On exit the handlers found on entry are back in place.

The loader's worker processes ignore both signals (``usmkit.data.loader.StopSignalsIgnored``): a Ctrl-C in a
terminal reaches every process of the foreground group, and a scheduler's SIGTERM (or torchrun's) the whole
group too; the workers must outlive it to serve the last step, and the main process ends them.

    with StopSignals() as stop:
        while ...:
            if stop.signum is not None:
                break
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from usmkit.errors import UsageError

SIGNALS = (signal.SIGINT, signal.SIGTERM)
FORWARDED_WITHIN_S = 1.0  # torchrun passes a signal on to its workers at once


def under_torchrun() -> bool:
    """Whether this process is a worker that torchrun (torch.distributed.elastic) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ


class TrainingInterrupted(UsageError):
    """Training stopped on a signal after saving a checkpoint; ``exit_code`` is 128 + the signal's number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """Records the first SIGINT or SIGTERM in ``signum`` instead of letting it end the process. Outside the
    main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._first_at = 0.0  # time.monotonic() of the first signal
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)

    def restore(self) -> None:
        """Put back the handlers found by ``install``."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            if under_torchrun() and time.monotonic() - self._first_at < FORWARDED_WITHIN_S:
                return  # torchrun's copy of the Ctrl-C the terminal sent
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        if self.signum is None:
            self.signum = signum
            self._first_at = time.monotonic()
            again = " (Ctrl-C again stops at once, without a checkpoint)" if signum == signal.SIGINT else ""
            notice = f"{signal.Signals(signum).name} received: finishing this step and saving a checkpoint{again}\n"
            try:
                os.write(2, notice.encode())
            except OSError:  # no stderr to tell: the stop still happens
                pass
