"""A signal whose KeyboardInterrupt Python drops (it landed inside a finaliser) is raised later,
at the next safe point, instead of being lost."""

from __future__ import annotations

import gc
import signal
import sys

import pytest

from drift_cli import interrupt


class RaisesInFinaliser:
    def __del__(self):
        interrupt._on_signal(signal.SIGTERM, None)    # what the handler does when SIGTERM lands here


def test_an_interrupt_dropped_in_a_finaliser_is_raised_at_the_next_check(monkeypatch, capsys):
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(interrupt, "_received", [])
    monkeypatch.setattr(interrupt, "_dropped", [])
    sys.unraisablehook = interrupt._unraisable
    obj = RaisesInFinaliser()
    del obj
    gc.collect()
    assert "Exception ignored" not in capsys.readouterr().err     # nothing printed
    with pytest.raises(interrupt.Terminated):
        interrupt.check()
    interrupt.check()                                             # raised once, then a no-op


def test_other_unraisable_exceptions_still_reach_the_default_hook(monkeypatch, capsys):
    monkeypatch.setattr(interrupt, "_dropped", [])

    class Boom:
        def __del__(self):
            raise ValueError("boom")

    monkeypatch.setattr(sys, "unraisablehook", interrupt._unraisable)
    b = Boom()
    del b
    gc.collect()
    assert "ValueError: boom" in capsys.readouterr().err
    interrupt.check()
