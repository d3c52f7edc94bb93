"""StopSignals: the first SIGINT or SIGTERM is recorded, a second Ctrl-C stops at once, except torchrun's own
copy of a Ctrl-C, which reaches its workers a moment after the terminal's."""

from __future__ import annotations

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
