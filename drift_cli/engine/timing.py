"""Phase timing inside one iteration, without host-device syncs inside the iteration.

On CUDA each span records a pair of events and the durations are read once, after the single
synchronisation at the iteration boundary. On the CPU spans read `time.perf_counter`.
Spans may nest (the draft span contains the draft model's forward span); each name accumulates.
A span of one name never encloses another of the same name, so each name keeps one span
object: entering and leaving it are two plain method calls (a generator-based context manager
cost several microseconds per span inside the models' cache-cold loop, charged to the span).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class _Span:
    """A CPU span: accumulates perf_counter milliseconds under its name."""

    __slots__ = ("ms", "name", "t0")

    def __init__(self, ms: dict[str, float], name: str) -> None:
        self.ms, self.name, self.t0 = ms, name, 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.ms[self.name] += (time.perf_counter() - self.t0) * 1e3


class _CudaSpan(_Span):
    """A CUDA span: a pair of events per entry, read at the iteration's sync."""

    __slots__ = ("events", "start")

    def __init__(self, ms: dict[str, float], name: str, events: list) -> None:
        super().__init__(ms, name)
        self.events, self.start = events, None

    def __enter__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def __exit__(self, *exc) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events.append((self.name, self.start, end))


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


class IterationClock:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._ms: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []
        self._spans: dict[str, _Span] = {}

    def span(self, name: str) -> _Span:
        """`with clock.span(name):` times the block under `name`."""
        s = self._spans.get(name)
        if s is None:
            s = self._spans[name] = _CudaSpan(self._ms, name, self._events) if self.cuda else _Span(self._ms, name)
        return s

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def read(self) -> dict[str, float]:
        """Sync once, return {span name: milliseconds} for everything since the last read, and reset."""
        self.sync()
        for name, start, end in self._events:
            self._ms[name] += start.elapsed_time(end)  # type: ignore[attr-defined]
        out = dict(self._ms)
        self._ms.clear()
        self._events.clear()
        return out


class NullClock(IterationClock):
    """A clock that measures nothing (for callers outside the engine loop)."""

    def span(self, name: str) -> _NullSpan:
        return _NULL


_NULL = _NullSpan()
