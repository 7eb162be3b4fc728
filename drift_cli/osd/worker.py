"""The background worker of `osd --osd-async`: OSD's updates off the decode path.

The worker is a thread (torch releases the GIL inside its kernels, so an AdamW step runs beside
the decoder's forward passes). It owns a private copy of the draft and its own AdamW; the
decoder's draft is never written by it. Per update it samples a `ReplayBuffer.snapshot` of the
feedback buffer the decoder keeps filling, runs the AdamW steps, then publishes a finished
version: a fresh copy of the trained parameters (the back buffer, never written again) with a
version number and the feedback it had seen, swapped in under a lock. The decoder takes the
newest version at an iteration boundary (`newest`) and copies it into its own draft; it never
waits for an update, and a half-written tensor is never visible to it.

Requests. The decoder asks for an update at OSD's cadence (`--osd-interval`); requests that
arrive while an update runs are merged into the next one, which samples the newest buffer
(`coalesced` counts them): the worker never queues work it cannot finish.

Threads. torch's intra-op thread count is process-wide, not per thread: a
`torch.set_num_threads` in one thread changes the count every thread reads and uses (measured:
after the worker sets 1 and the decoder sets 2, both threads read 2 from torch and from OpenMP).
So the worker never sets it: the decoder owns the count (`--threads`), the worker runs with the
same one, and `--osd-threads` is accepted only equal to it (`drift_cli.bench_config`). On the
2-core CPU at the default of 1 that is one core for decoding and one for the worker. A distinct
count would need a worker process.

CUDA. The worker queues its kernels on a stream of its own, so that they overlap the decoder's
instead of queueing behind them on the default stream. Each update first makes that stream wait
for the decoder's work queued so far (the buffer entries it samples are written there), and the
stream is synchronised before a version is published: the decoder's copy never reads a tensor
still being written.

Stopping. `stop` (end of stream, Ctrl-C or SIGTERM) sets a flag the worker reads between AdamW
steps and while it is held; an update cut short is not published. The thread is joined: no
worker outlives its stream.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from drift_cli.osd.buffer import ReplayBuffer
from drift_cli.osd.config import OSDConfig
from drift_cli.osd.trainer import DraftTrainer

THREAD_NAME = "osd-worker"
_POLL_S = 0.05          # how often a held worker looks at its stop flag


@dataclass(frozen=True)
class Weights:
    """One finished version of the trained parameters (never written after it is published)."""

    version: int                          # 1, 2, ... in publishing order
    seen: int                             # verification steps whose feedback the update's buffer held
    tensors: dict[str, torch.Tensor]      # trainable parameter name -> its value


@dataclass
class WorkerStats:
    updates: int = 0                      # published
    requested: int = 0                    # asked for by the decoder
    coalesced: int = 0                    # requests merged into a later update (the worker was busy)
    train_ms: list[float] = field(default_factory=list)     # per update: wall clock of its AdamW steps
    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    gradient_bytes: int = 0
    cpu_seconds: float = 0.0              # the worker thread's CPU time (time.thread_time), whole life
    threads: int = 0                      # torch threads the worker ran with (read inside it)


class BackgroundTrainer:
    """A thread that trains a copy of `model` from `buffer` and publishes finished weights.

    Test hooks (None in runs): `hold`, an Event the worker waits for before each update (a
    worker slowed on purpose); `on_step(i)`, called after AdamW step i inside an update;
    `on_publish(weights)`, called after a version is published."""

    def __init__(self, model: torch.nn.Module, cfg: OSDConfig, buffer: ReplayBuffer, seed: int) -> None:
        self.model = copy.deepcopy(model)                     # the worker's own copy (a head's shares the target's parts)
        self.cfg, self.buffer = cfg, buffer
        self.trainer = DraftTrainer(self.model, cfg)
        trained = {id(p) for p in self.trainer.params}
        self.names = [n for n, p in self.model.named_parameters() if id(p) in trained]
        self.generator = torch.Generator().manual_seed(seed)
        self.stats = WorkerStats()
        self.hold: threading.Event | None = None
        self.on_step: Callable[[int], None] | None = None
        self.on_publish: Callable[[Weights], None] | None = None
        self._cond = threading.Condition()
        self._published: Weights | None = None
        self._temperature = self._update_temperature = 1.0
        self._served = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stream: torch.cuda.Stream | None = None
        self._error: Exception | None = None

    # -- the decoder's side --------------------------------------------------------------------

    def request(self, temperature: float) -> None:
        """Ask for an update (never blocks on one); starts the thread on the first request."""
        self._raise()
        if self._thread is None:
            self.start()
        with self._cond:
            self.stats.requested += 1
            self._temperature = temperature
            self._cond.notify()

    def newest(self) -> Weights | None:
        """The newest published version (None before the first)."""
        self._raise()
        with self._cond:
            return self._published

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread (an update in progress ends after its current AdamW step)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _raise(self) -> None:
        """A worker that failed fails the run (in the decoder's thread), rather than leaving a
        draft that silently stops learning."""
        if self._error is not None:
            raise RuntimeError(f"the osd worker failed: {self._error!r}") from self._error

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- the worker's side ---------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        device = next(self.model.parameters()).device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        try:
            with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
                while self._next():
                    self._update()
                    self.stats.cpu_seconds = time.thread_time() - cpu0
        except Exception as e:                               # handed to the decoder at its next call
            self._error = e
        finally:
            self.stats.cpu_seconds = time.thread_time() - cpu0

    def _next(self) -> bool:
        """Wait for a request (True) or the stop flag (False); merge the requests that piled up."""
        with self._cond:
            while not self._stopping and self._served == self.stats.requested:
                self._cond.wait()
            if self._stopping:
                return False
            self.stats.coalesced += self.stats.requested - self._served - 1
            self._served = self.stats.requested
            self._update_temperature = self._temperature
        while self.hold is not None and not self.hold.wait(_POLL_S):
            if self._stopping:
                return False
        return not self._stopping

    def _update(self) -> None:
        announce_update(self.stats.updates + 1)
        self.stats.threads = torch.get_num_threads()
        buffer = self.buffer.snapshot()
        if not len(buffer):
            return
        if self._stream is not None:                         # the entries' writes, queued by the decoder
            self._stream.wait_stream(torch.cuda.default_stream(self._stream.device))
        t0 = time.perf_counter()
        loss, norm, grad_bytes = self.trainer.update(buffer, self._update_temperature, self.generator, self._go_on)
        if self._stopping:
            return                                           # cut short: never published
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            tensors = {n: params[n].detach().clone() for n in self.names}   # the back buffer
        if self._stream is not None:
            self._stream.synchronize()                       # written in full before anyone may read it
        s = self.stats
        s.train_ms.append((time.perf_counter() - t0) * 1e3)
        s.loss.append(loss)
        s.grad_norm.append(norm)
        s.gradient_bytes = max(s.gradient_bytes, grad_bytes)
        with self._cond:
            s.updates += 1
            self._published = Weights(s.updates, buffer.seen, tensors)
            published = self._published
        if self.on_publish is not None:
            self.on_publish(published)

    def _go_on(self, step: int) -> bool:
        if self.on_step is not None:
            self.on_step(step)
        return not self._stopping

    def published_bytes(self) -> int:
        w = self.newest()
        return 0 if w is None else sum(t.nbytes for t in w.tensors.values())


def announce_update(n: int) -> None:
    """With $DRIFT_OSD_UPDATES_FILE set, append a line as the worker starts its n-th update: an
    event a test (or a scheduler) can wait for instead of guessing from wall time."""
    path = os.environ.get("DRIFT_OSD_UPDATES_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"update {n}\n")
