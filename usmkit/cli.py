"""argparse pieces shared by the entry points that use argparse (usmkit-transcribe, usmkit-serve).

A bad argument raises ``UsageError`` (one line, exit code 2, through ``usmkit.errors.user_errors``)
instead of argparse's own ``sys.exit(2)`` with the usage, so ``main()`` stays in charge.
"""

from __future__ import annotations

import argparse

from usmkit.errors import UsageError


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
