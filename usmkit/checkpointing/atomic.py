"""Files and folders that are never seen half-written: write under a private temporary name beside the
target, then rename into place.

A reader (another process building the same folder, a loader, a resumed run) sees the old version or
the new one, never a part; a write that fails or is killed leaves the old version as it was (and a
temporary ``.tmp-*`` entry that the next writer may clear). The temporary name is the writer's own, so
two processes writing one path at once each rename a whole file. Every atomic write in usmkit goes
through this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from usmkit.errors import UsageError


class WriteError(UsageError):
    """A file that could not be written (e.g. a full disk); what was there before is intact. A failure of
    the machine rather than of the input: exit code 1."""

    exit_code = 1


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix) to write; on success it replaces ``path``.
    A symbolic link at ``path`` is replaced by the file, never written through to what it points at.
    A special file at ``path`` (``/dev/null``, ``/dev/stdout``, a named pipe) is written in place: it
    cannot be half-written, and renaming over it would replace the device with a plain file.

    >>> with replaced_atomically("out/x.flac") as tmp:  # doctest: +SKIP
    ...     soundfile.write(tmp, samples, 16000)
    """
    path = Path(path)
    if is_special_file(path):
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def replaced_dir_atomically(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[Path]:
    """Yield a new empty folder ``.tmp-<name>-*`` beside ``path`` to fill; on success it replaces ``path``
    (``move_into_place``), on any failure it is removed and ``path`` is untouched. ``durable``: the files
    and folders are flushed to disk before the rename (checkpoints), so a power cut cannot leave a
    renamed folder of empty files."""
    path = Path(path)
    refuse_non_folder(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it private; what it becomes is shared like any output
        if durable:
            fsync_tree(tmp)
        move_into_place(tmp, path, durable=durable)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_special_file(path: Path) -> bool:
    """Whether ``path`` (not followed if it is a link) is a device, pipe or socket rather than a file
    or folder."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def refuse_non_folder(path: Path) -> None:
    """A folder output must not replace a file, device or pipe that is already at ``path``."""
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{path} exists and is not a folder; name a folder to write (it will be replaced)")


def move_into_place(tmp: Path, path: Path, *, durable: bool = False) -> None:
    """Rename the finished folder ``tmp`` to ``path``. An existing ``path`` is first renamed aside and
    removed only once ``tmp`` is in place, so a kill in between leaves one whole version under a name."""
    refuse_non_folder(path)
    old = None
    if path.exists():
        old = path.with_name(f".tmp-{path.name}-old-{uuid.uuid4().hex[:8]}")
        os.replace(path, old)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then the folders, to disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(Path(folder) / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(folder))


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename inside it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def disk_full_reason(e: BaseException, where: Path) -> str:
    """What went wrong in ``e``, naming the file system holding ``where`` when it is full."""
    text = f"{type(e).__name__}: {e}"
    if is_disk_full(e):
        try:
            usage = shutil.disk_usage(where)
            return (
                f"the file system holding {where} is full ({usage.free / 2**20:.1f} MiB free of "
                f"{usage.total / 2**20:.1f} MiB); {text}"
            )
        except OSError:
            return f"the file system holding {where} is full; {text}"
    return text


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` (an ``OSError``, or a library's error wrapping one) says the file system is full."""
    errno_ = getattr(e, "errno", None) or getattr(e.__cause__, "errno", None)
    return errno_ in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)


@contextlib.contextmanager
def disk_full_is_one_line(where: Path, what: str, todo: str) -> Iterator[None]:
    """Turn a full disk while writing ``what`` under ``where`` into one ``WriteError`` line ending with
    ``todo`` (what is intact, what to do); other errors pass unchanged."""
    try:
        yield
    except WriteError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise WriteError(f"could not write {what} ({disk_full_reason(e, where)}); {todo}") from e


def write_result_file(path: str | os.PathLike[str], text: str, *, what: str) -> Path:
    """Write ``text`` (a command's result: evaluation JSON, a transcript) to ``path`` through
    ``replaced_atomically``. A file that cannot be written is one line naming ``what`` and ``path``, the
    earlier version intact: ``WriteError`` (exit 1) for a full disk, ``UsageError`` for any other refusal
    (a folder where the file goes, no permission)."""
    path = Path(path)
    try:
        with replaced_atomically(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        kind = WriteError if is_disk_full(e) else UsageError
        raise kind(
            f"could not write {what} {path} ({disk_full_reason(e, path.parent)}); what was there before is "
            "unchanged: free space or pass a path that can be written"
        ) from e
    return path
