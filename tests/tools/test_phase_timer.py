"""tools.phase_timer: per-phase wall time of a loop, and the classes given their methods back."""

from __future__ import annotations

import time

from tools.phase_timer import PhaseTimer


class _Loop:
    def outer(self):
        self.inner()
        return "done"

    def inner(self):
        time.sleep(0.01)


def test_phases_count_their_calls_and_time_and_restore_the_methods():
    original = _Loop.inner
    loop = _Loop()
    with PhaseTimer({"outer": (_Loop, "outer"), "inner": (_Loop, "inner")}) as timer:
        assert loop.outer() == "done"
        loop.inner()
    assert len(timer.starts["inner"]) == 2 and len(timer.starts["outer"]) == 1
    assert timer.seconds["inner"] >= 0.02 and timer.seconds["outer"] >= 0.01
    assert _Loop.inner is original
