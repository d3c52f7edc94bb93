"""Checkpoints written in the background: the training loop hands over a copy and goes on training.

``CheckpointWriter`` owns one thread that runs its jobs in the order they came: writing a checkpoint
(``write_checkpoint`` of a ``CheckpointContent`` taken with ``copy=True``: the same files, SHA-256 records
and atomic rename as a checkpoint written in the loop), what follows it (pruning the old ones), then what
needs it in place (``best.json`` pointing at it, ``then``). One checkpoint at most is in flight: ``write``
waits for the one before, so host memory holds one copy of the weights and train state at a time.

A failure is kept, never lost: ``failed`` says so at once (cheap enough to ask every step), ``wait``
raises it as a ``CheckpointWriteError`` naming the checkpoint, and the jobs queued behind it are dropped
(no ``best.json`` names a checkpoint that is not there). The checkpoints written before it are intact.

    writer = CheckpointWriter()
    writer.write(ckpt_root, step, checkpoint_content(module, state, config_yaml, copy=True), then=prune)
    ...                # train on; poll writer.failed
    writer.wait()      # before the next write is handed over, and before the run ends
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from usmkit.checkpointing.checkpoint import (
    CheckpointContent,
    CheckpointWriteError,
    checkpoint_dir,
    write_checkpoint,
)

log = logging.getLogger(__name__)

_Job = tuple[str, Callable[[], object]]  # (what it is, for its failure's message; the work)


class CheckpointWriter:
    """Writes checkpoints on a background thread, one after the other (see the module's docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failure: tuple[str, BaseException] | None = None
        self._failed = threading.Event()
        self.last_write_s: float | None = None  # how long the last checkpoint took to write, in the background

    def write(
        self, ckpt_root: Path, step: int, content: CheckpointContent, then: Callable[[Path], object] | None = None
    ) -> Path:
        """Wait for the checkpoint in flight (raising its failure), then write ``content`` as checkpoint
        ``step`` in the background, followed by ``then(path)``. Returns the path it will have."""
        self.wait()
        path = checkpoint_dir(ckpt_root, step)

        def job() -> None:
            start = time.perf_counter()
            write_checkpoint(ckpt_root, step, content)
            self.last_write_s = time.perf_counter() - start
            log.info("step %d: checkpoint %s written in the background in %.1f s", step, path.name, self.last_write_s)
            if then is not None:
                then(path)

        self._submit(f"step {step}'s checkpoint", job)
        return path

    def then(self, what: str, job: Callable[[], object]) -> None:
        """Run ``job`` once the checkpoint handed over last is in place (soon, if it already is); it is
        dropped if that write fails. ``what`` names it in its failure's message."""
        self._submit(what, job)

    @property
    def failed(self) -> bool:
        """Whether a job failed (``wait`` raises it)."""
        return self._failed.is_set()

    def wait(self) -> None:
        """Block until every job handed over is done; raise the first failure among them, once."""
        failure = self.finish()
        if failure is not None:
            raise failure

    def finish(self) -> BaseException | None:
        """Block until every job handed over is done; return the first failure among them (once) instead
        of raising it. A failure that is no ``Exception`` (a ``KeyboardInterrupt``) comes back as it was."""
        self._jobs.join()
        if self._failure is None:
            return None
        (what, error), self._failure = self._failure, None
        self._failed.clear()
        if not isinstance(error, Exception):
            return error
        if isinstance(error, CheckpointWriteError):  # it names the checkpoint, the cause and what to do
            return CheckpointWriteError(f"{what}, written in the background, failed: {error}")
        cause = " ".join(f"{type(error).__name__}: {error}".split())
        return CheckpointWriteError(
            f"{what} failed in the background ({cause}); the checkpoints written before it are intact: "
            "fix the cause, then run the same command with resume=true"
        )

    def _submit(self, what: str, job: Callable[[], object]) -> None:
        if self._thread is None:
            # A daemon: an interpreter that exits without ``wait`` (a crash) leaves at most a temporary
            # folder, which the next write clears; ``Trainer.fit`` always waits.
            self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
            self._thread.start()
        self._jobs.put((what, job))

    def _run(self) -> None:
        while True:
            what, job = self._jobs.get()
            try:
                if not self._failed.is_set():  # behind a failure, nothing more is written
                    job()
            except BaseException as e:  # kept for the training loop, which raises it
                self._failure = (what, e)
                self._failed.set()
            finally:
                del job  # the job holds the checkpoint's copy: free it now, not when the next job comes
                self._jobs.task_done()
