"""The weight-read floor: the least time a forward can take where it is a read of the weights.

A forward that scores a few tokens must read every weight matrix of the decoder once and the
output head's rows (all of them, or a draft's vocabulary subset); it need not read the embedding
table, of which it looks up a few rows (a tied head is counted once, as the head). The floor is
those bytes over the read bandwidth measured in the same process, on the same threads, over the
same tensors: a reduction of each large one, timed. Tensors under `SMALL` elements (norms,
biases) count in the bytes but not in the timing, where a call's fixed cost would swamp their read.

Two reductions are timed and the faster kept: `torch.sum`, and on float32 CPU tensors the
extension's `read_sum`, which reads on the skinny GEMM's own threads. They differ where PyTorch's
OpenMP threads are slow to start: drift_cli makes them sleep when idle (`OMP_WAIT_POLICY=PASSIVE`,
drift_cli/__init__.py), and then every `torch.sum` on two threads pays a wake-up (6 ms over the
211 tensors of SmolLM2-135M on the Zen 5 EPYC), which would flatter every ratio to the floor.
"""

from __future__ import annotations

import time

import torch

from drift_cli.engine import cpu_linear

SMALL = 1 << 16          # elements: smaller tensors are counted, not timed


def read_tensors(lm) -> list[torch.Tensor]:
    """What one forward of `lm` (a `CausalLM` or `HeadDrafter`) must read: its model's
    parameters but the embedding tables, then the output head's rows (each storage once)."""
    model, head = lm.model, lm.head
    rows = head.linear.weight if head.ids is None or head.compact else head._subset_rows()
    skip = {p.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    skip.add(head.linear.weight.data_ptr())
    out, seen = [], set()
    for p in model.parameters():
        if p.data_ptr() not in skip and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out.append(p.detach())
    return out + [rows.detach()]


def read_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


_READ_SUM = cpu_linear.extension("read_sum")


def read_ms(tensors: list[torch.Tensor]) -> float:
    """ms to read all of `tensors` once at the bandwidth the faster of the timed reductions over
    the large ones reaches (one measurement each; callers keep the fastest of several)."""
    big = [t for t in tensors if t.numel() >= SMALL] or tensors
    cuda = big[0].device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(big[0].device)
    t0 = time.perf_counter()
    for t in big:
        t.sum()
    if cuda:
        torch.cuda.synchronize(big[0].device)
    ms = (time.perf_counter() - t0) * 1e3
    if _READ_SUM is not None and all(t.is_cpu and t.dtype is torch.float32 and t.is_contiguous() for t in big):
        t0 = time.perf_counter()
        _READ_SUM(big, torch.get_num_threads())
        ms = min(ms, (time.perf_counter() - t0) * 1e3)
    return ms * read_bytes(tensors) / max(1, read_bytes(big))
