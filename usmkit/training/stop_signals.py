"""A clean stop of training on SIGINT (Ctrl-C) or SIGTERM (``kill``, a job scheduler's time limit).

While ``StopSignals`` is entered (``Trainer.fit``), either signal only records itself: the loop finishes
the step it is in, saves a checkpoint and raises ``TrainingInterrupted``, whose exit code is the shell's
for that signal (130 for SIGINT, 143 for SIGTERM). A second SIGINT stops at once (``KeyboardInterrupt``);
the last checkpoint on disk stays intact. On exit the handlers found on entry are back in place.

The loader's worker processes ignore SIGINT (``usmkit.data.loader``): a Ctrl-C in a terminal reaches every
process of the foreground group, and the workers must outlive it to serve the last step.

    with StopSignals() as stop:
        while ...:
            if stop.signum is not None:
                break
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from usmkit.errors import UsageError

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        if self.signum is None:
            self.signum = signum
            again = " (Ctrl-C again stops at once, without a checkpoint)" if signum == signal.SIGINT else ""
            log.warning(
                "%s received: finishing this step and saving a checkpoint%s", signal.Signals(signum).name, again
            )
