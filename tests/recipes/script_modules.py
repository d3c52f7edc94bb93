"""A recipe or study script (a file, not a package module) loaded as a module for its tests, and its steps' arguments."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def script_module(name: str, path: Path) -> Iterator[ModuleType]:
    """``path`` as module ``name``, in ``sys.modules`` while in use (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def step_overrides(step) -> dict[str, str]:
    """A recipe step's ``key=value`` arguments as the command line gets them."""
    return dict(a.split("=", 1) for a in step.argv() if "=" in a)
