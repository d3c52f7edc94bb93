"""StopSignals: the first SIGINT or SIGTERM is recorded, a second Ctrl-C stops at once, except torchrun's own
copy of a Ctrl-C, which reaches its workers a moment after the terminal's."""

from __future__ import annotations

import io
import logging
import os
import signal

import pytest

from usmkit.training import stop_signals
from usmkit.training.stop_signals import StopSignals


def test_the_first_signal_is_recorded_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # a second SIGTERM changes nothing
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_ctrl_c_stops_at_once(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with StopSignals() as stop, pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        assert stop.signum == signal.SIGINT
        signal.raise_signal(signal.SIGINT)


def test_under_torchrun_its_copy_of_the_ctrl_c_is_not_a_second_one(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # torchrun passing the terminal's Ctrl-C on
        assert stop.signum == signal.SIGINT
    monkeypatch.setattr(stop_signals, "FORWARDED_WITHIN_S", 0.0)
    with StopSignals(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # later than a forward: the user pressed Ctrl-C again


class _SignalMidWrite(io.StringIO):
    """A log stream that, like a ``BufferedWriter``, refuses a write begun inside another: its first write sends
    SIGINT to this process, so the signal handler runs while that write is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.armed, self.busy, self.reentered = True, False, False

    def write(self, text: str) -> int:
        if self.busy:
            self.reentered = True
            raise RuntimeError("reentrant call")
        self.busy = True
        try:
            if self.armed:
                self.armed = False
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # Python runs signal handlers between bytecodes
                    pass
            return super().write(text)
        finally:
            self.busy = False


def test_the_signal_notice_never_reenters_a_log_write_it_interrupts(capfd):
    stream = _SignalMidWrite()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with StopSignals() as stop:
            logging.getLogger("usmkit.test").warning("a line being written when Ctrl-C comes")
            assert stop.signum == signal.SIGINT
    finally:
        root.removeHandler(handler)
    assert not stream.reentered and "a line being written" in stream.getvalue()
    err = capfd.readouterr().err
    assert "SIGINT received: finishing this step and saving a checkpoint" in err and "Logging error" not in err
