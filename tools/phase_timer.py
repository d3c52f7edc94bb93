"""Wall time per phase of a loop, measured in process: the methods a table names, wrapped for a ``with`` block.

    with PhaseTimer({"step": (Recognizer, "run"), "decode": (ServerStream, "encoded")}) as timer:
        ...  # the loop
    timer.seconds["step"], timer.starts["step"]

Nested phases (a method called inside another's) each count their own time, so an outer phase includes its
inner ones.
"""

from __future__ import annotations

import time
from collections import defaultdict


class PhaseTimer:
    """``phases``: {phase: (class, method name)}. Inside the block each call of a method adds its wall time to
    ``seconds[phase]`` and its start time (``time.perf_counter``) to ``starts[phase]``; on exit the classes get
    their own methods back."""

    def __init__(self, phases: dict[str, tuple[type, str]]) -> None:
        self.phases = phases
        self.seconds: dict[str, float] = defaultdict(float)
        self.starts: dict[str, list[float]] = defaultdict(list)
        self._originals: dict[str, object] = {}

    def __enter__(self) -> PhaseTimer:
        for phase, (cls, name) in self.phases.items():
            original = getattr(cls, name)
            self._originals[phase] = original

            def timed(*args, _original=original, _phase=phase, **kwargs):
                start = time.perf_counter()
                self.starts[_phase].append(start)
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds[_phase] += time.perf_counter() - start

            setattr(cls, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for phase, (cls, name) in self.phases.items():
            setattr(cls, name, self._originals[phase])
