"""`--background-load`: a neutral load beside the decoder, for a fair budget against `osd --osd-async`.

Async OSD trains on a second thread (the second core of a 2-core CPU). To see how much of its
result is that thread's interference rather than its training, a method can run with the same
second thread busy doing work of the same shape that changes nothing: matmuls of the draft's
output head ([V, d]; an EAGLE head's largest matrix) against [ROWS, d] activations, the shape
of an OSD update's head products, in a loop until the stream ends. The load never pauses, so it
bounds the interference of a worker that is busy only while an update runs. Its thread's CPU
seconds (`time.thread_time`) and matmul count go into the method's report as `background_load`.
Like the OSD worker it runs with torch's process-wide thread count (the run's `--threads`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

ROWS = 256            # activation rows per product: 16 buffered positions x 16 (OSD's default batch, packed)
THREAD_NAME = "background-load"


class BackgroundLoad:
    """Context manager: a thread doing [ROWS, d] x [d, V] products until the block ends."""

    def __init__(self, draft: torch.nn.Module, rows: int = ROWS) -> None:
        w = head_matrix(draft)
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(rows, w.shape[1], generator=gen, dtype=torch.float32).to(w.device, w.dtype)
        self.b = torch.randn(w.shape[1], w.shape[0], generator=gen, dtype=torch.float32).to(w.device, w.dtype)
        self.matmuls = 0
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "BackgroundLoad":
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        cpu0 = time.thread_time()
        with torch.inference_mode():
            while not self._stop.is_set():
                self.a @ self.b
                if self.a.device.type == "cuda":
                    torch.cuda.synchronize(self.a.device)
                self.matmuls += 1
        self.cpu_seconds = time.thread_time() - cpu0

    def report(self) -> dict[str, Any]:
        return {"seconds": self.cpu_seconds, "matmuls": self.matmuls,
                "shape": [list(self.a.shape), list(self.b.shape)]}


def head_matrix(draft: torch.nn.Module) -> torch.Tensor:
    """The draft's output head [V, d] (an EAGLE head without one of its own: its largest matrix)."""
    get = getattr(draft, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is not None and getattr(head, "weight", None) is not None:
        return head.weight
    return max((p for p in draft.parameters() if p.dim() == 2), key=lambda p: p.numel())
