"""One run per experiment directory: the run that owns ``exp_dir`` holds its lock until it ends.

    lock = ExpDirLock(exp_dir)
    lock.acquire()   # UsageError naming the owner when another run holds it
    ...
    lock.release()   # also on errors (TrainingRecipe.cleanup)

Two files: ``exp_dir/.run.flock``, which ``filelock.FileLock`` locks (the kernel drops the lock when its
process dies, however it dies), and ``exp_dir/run.lock``, the owner's record (pid, host, start time,
command line) that only the holder writes and that names the owner to a second run. The record is a
file of its own because filelock owns its lock file (what it leaves in it differs between versions).
A record left by a run that was killed is stale: when it names a process of this host that is gone,
the next run takes the lock over with a warning; a record from another host, whose process cannot be
checked from here, is refused with the way to clear it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from usmkit.checkpointing.atomic import WriteError, disk_full_reason, replaced_atomically
from usmkit.errors import UsageError

log = logging.getLogger(__name__)

RECORD_FILE = "run.lock"
FLOCK_FILE = ".run.flock"


class ExpDirLocked(UsageError):
    """Another run owns the experiment directory."""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else None
    since = f", since {when}" if started and when else ""
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}{since}"


class ExpDirLock:
    """The lock of experiment directory ``exp_dir`` (created if missing)."""

    def __init__(self, exp_dir: str | os.PathLike[str]) -> None:
        self.exp_dir = Path(exp_dir)
        self.record = self.exp_dir / RECORD_FILE
        self._lock = FileLock(str(self.exp_dir / FLOCK_FILE), timeout=0)

    def _read_record(self) -> dict | None:
        try:
            owner = json.loads(self.record.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable (cut short by a kill mid-write): no owner can be named
        return owner if isinstance(owner, dict) else {}

    def acquire(self) -> None:
        """Take the lock, or raise ``ExpDirLocked`` naming the run that holds it (``WriteError`` where the
        lock's files cannot be written, e.g. on a full disk)."""
        try:
            self._acquire()
        except OSError as e:
            raise WriteError(
                f"cannot lock {self.exp_dir} ({disk_full_reason(e, self.exp_dir.parent)}); nothing in it was changed"
            ) from e

    def _acquire(self) -> None:
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            owner = self._read_record()
            who = _describe(owner) if owner else "its owner record is not written yet"
            raise ExpDirLocked(
                f"{self.exp_dir} is in use by another training run ({who}); wait for it to end or choose "
                "another trainer.exp_dir"
            ) from None
        try:
            self._check_stale()
            with replaced_atomically(self.record) as tmp:
                tmp.write_text(
                    json.dumps(
                        {
                            "pid": os.getpid(),
                            "host": socket.gethostname(),
                            "started": time.time(),
                            "command": sys.argv,
                        }
                    )
                )
        except BaseException:
            self._lock.release()
            raise

    def _check_stale(self) -> None:
        """With the file lock held: take over the record a killed run left, or refuse one that may be live."""
        owner = self._read_record()
        if owner is None:
            return
        if not owner:
            log.warning("%s is unreadable and its lock free: taking the lock over", self.record)
            return
        pid, host = owner.get("pid"), owner.get("host")
        if host == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
            if _alive(pid):  # running, yet without the file lock: this file system's locks may not reach it
                raise ExpDirLocked(
                    f"{self.exp_dir} is in use by another training run ({_describe(owner)}, recorded in "
                    f"{self.record}); wait for it to end, or if that process is no training run of this "
                    "directory, delete the record and start again"
                )
            log.warning(
                "%s names a run that is no longer running (%s): taking the lock over", self.record, _describe(owner)
            )
        elif host != socket.gethostname():
            raise ExpDirLocked(
                f"{self.exp_dir} is locked by a run on another host ({_describe(owner)}), which cannot be checked "
                f"from here; if that run has ended, delete {self.record} and start again"
            )

    def release(self) -> None:
        """Drop the record and the lock (a no-op when not held)."""
        if not self._lock.is_locked:
            return
        try:
            self.record.unlink(missing_ok=True)
        finally:
            self._lock.release()
