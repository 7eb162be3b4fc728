"""Ctrl-C and SIGTERM, in one place.

SIGTERM (what schedulers, containers and CI runners send) is treated like Ctrl-C: both raise a
`KeyboardInterrupt` (`Terminated` for SIGTERM) where the program is, so a run stops the stream
it is in, keeps what finished and writes it marked `"complete": false`. The exit status is
128 + the signal: 130 for SIGINT, 143 for SIGTERM. `deferred()` holds both signals while the
final write runs, so that a finished run is never lost to a late Ctrl-C.

A signal that lands while Python runs a finaliser (a `__del__`, a weakref callback) raises
there, and Python drops such an exception ("Exception ignored in ...") instead of propagating it.
`install()` sets a `sys.unraisablehook` that keeps those interrupts quiet and remembers them, and
`check()`, called at safe points (every decoding iteration, between suite cells), raises them.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import Iterator, NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = tuple(128 + s for s in SIGNALS)   # 130, 143
_received: list[int] = []   # the signals received so far, in order
_dropped: list[int] = []    # signals whose exception Python dropped (raised inside a finaliser)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Python raises KeyboardInterrupt for SIGINT."""


def _raise(signum: int) -> None:
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame) -> None:
    _received.append(signum)
    _raise(signum)


def _unraisable(info) -> None:
    """An interrupt raised inside a finaliser: remember it for `check()`, print nothing."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        _dropped.append(_received[-1] if _received else signal.SIGINT)
        return
    sys.__unraisablehook__(info)


def install() -> None:
    """Route SIGINT and SIGTERM to `_on_signal` (main thread only; a no-op elsewhere)."""
    with contextlib.suppress(ValueError):   # not the main thread (e.g. a test runner's worker)
        for s in SIGNALS:
            signal.signal(s, _on_signal)
    sys.unraisablehook = _unraisable


def check() -> None:
    """Raise an interrupt that Python dropped inside a finaliser (a no-op otherwise)."""
    if _dropped:
        _raise(_dropped.pop())



def ignore() -> None:
    """At process exit, the work done: a late signal must not kill the interpreter's shutdown
    (Python restores the default handlers while it finalises, but leaves ignored ones alone)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def signalled() -> bool:
    """Whether SIGINT or SIGTERM came during this process."""
    return bool(_received)


def exit_code() -> int:
    """128 + the last signal received; 130 (SIGINT) when none was (e.g. an interrupted prompt)."""
    return 128 + (_received[-1] if _received else signal.SIGINT)


def exit_incomplete(path: Path | str) -> NoReturn:
    """After writing an interrupted run: one line on stderr, exit 128 + the signal."""
    print(f"interrupted: what finished was written to {path} (\"complete\": false)", file=sys.stderr)
    sys.exit(exit_code())


@contextlib.contextmanager
def held() -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM until the block is done; yield the list of those that came (recorded
    as received, not raised): for work whose result must survive a late signal."""
    pending: list[int] = []
    try:
        previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in SIGNALS}
    except ValueError:   # not the main thread: signals cannot arrive here anyway
        yield pending
        return
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            _received.append(pending[0])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block is done, then raise the first one that came."""
    with held() as pending:
        yield
    if pending:
        _raise(pending[0])
