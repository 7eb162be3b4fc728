"""Phase timing inside one iteration, without host-device syncs inside the iteration.

On CUDA each span records a pair of events and the durations are read once, after the single
synchronisation at the iteration boundary. On the CPU spans read `time.perf_counter`.
Spans may nest (the draft span contains the draft model's forward span); each name accumulates.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch


class IterationClock:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._ms: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._ms[name] += (time.perf_counter() - t0) * 1e3

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

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        yield
