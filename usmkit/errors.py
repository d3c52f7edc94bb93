"""One error style for every entry point.

A user error (a bad config value, a missing file, bad data, a damaged checkpoint) is raised as a
``UsageError`` (or a subclass: ``ConfigError``, ``BadInputError``, ``CheckpointError``) whose message
names the value or file and what to do. Entry points run their body under ``user_errors()``, which
prints that message as ``error: ...`` on stderr and exits with the error's ``exit_code`` (2 for user
errors, 1 for failures of the machine such as a full disk), without a traceback. ``--debug`` on the
command line (removed before the arguments are parsed) or ``USMKIT_DEBUG=1`` lets the traceback
through instead::

    def main(argv=None) -> int:
        argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
        with user_errors():
            ...
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

DEBUG_ENV = "USMKIT_DEBUG"
DEBUG_FLAG = "--debug"


class UsageError(Exception):
    """An error the user can fix; its message names the value or file and what to do."""

    exit_code = 2


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")


def strip_debug_flag(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--debug``; when it was there, ``USMKIT_DEBUG=1`` is set for this process."""
    argv = list(argv)
    if DEBUG_FLAG in argv:
        os.environ[DEBUG_ENV] = "1"
        argv = [a for a in argv if a != DEBUG_FLAG]
    return argv


def strip_debug_from_sys_argv() -> None:
    """For entry points whose parser reads ``sys.argv`` itself (Hydra)."""
    sys.argv[1:] = strip_debug_flag(sys.argv[1:])


def one_line_message(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError) and e.filename and not str(e).startswith("no "):
        return f"{e.filename}: {e.strerror or 'not found'}"
    return str(e) or type(e).__name__


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn user errors (``UsageError``, and ``FileNotFoundError`` of a path the user gave) into
    ``error: <message>`` on stderr and ``SystemExit(exit_code)``; with ``--debug``/``USMKIT_DEBUG=1``
    re-raise them with their traceback."""
    try:
        yield
    except (UsageError, FileNotFoundError) as e:
        if debug_enabled():
            raise
        print(f"error: {one_line_message(e)}", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(getattr(e, "exit_code", 2)) from None


INTERRUPTED_EXIT = 130  # the shell's status of a process ended by SIGINT (128 + 2)


@contextlib.contextmanager
def interrupted_line(what: Callable[[], str]) -> Iterator[None]:
    """A Ctrl-C (``KeyboardInterrupt``) inside: ``error: interrupted (Ctrl-C); <what()>`` on stderr and
    ``SystemExit(130)``, without a traceback (``--debug``: the traceback). ``what`` says what was kept and how
    to go on; it is called only then, so it can read the state the command reached."""
    try:
        yield
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        print(f"error: interrupted (Ctrl-C); {what()}", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(INTERRUPTED_EXIT) from None
