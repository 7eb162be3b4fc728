"""One DRIFT draft step on the CPU path (`CpuBank.step`), warm and with the caches flushed.

    python benchmarks/bench_cpu_step.py [--n 1024] [--d 96] [--vocab 4096] [--flush-mb 12] [--repeats 400]

Inside the decoding loop the models' forward passes evict the bank and the interpreter's state
from the caches between two draft steps, so a step costs several times its warm time. This
benchmark shows the split: the call with an empty bank (argument handling only), the call with
a few prototypes (plus the bias add into the output row), and the full scan, each warm and
after writing `--flush-mb` MB (more than the L2 cache) before every call. Medians in µs.
Also compares reading h and z as torch tensors (the engine's path) with numpy views of them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drift_cli.drift import DriftBank, DriftConfig  # noqa: E402


def median_us(fn, repeats: int, flush=None) -> float:
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--flush-mb", type=float, default=12.0)
    ap.add_argument("--repeats", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(1)

    cfg = DriftConfig(bank_size=args.n)
    bank = DriftBank(cfg, args.d, args.vocab, backend="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        bank.keys.copy_(torch.nn.functional.normalize(torch.randn(args.n, args.d, generator=g), dim=1))
        bank.support.copy_(torch.randint(0, args.vocab, (args.n, cfg.support), generator=g))
        bank.bias.copy_(torch.randn(args.n, cfg.support, generator=g))
        bank.valid[:] = True
    hs, zs = torch.randn(1, 5, args.d, generator=g), torch.randn(1, 5, args.vocab, generator=g)
    h, z = hs[:, -1], zs[:, -1]                       # the engine's views of the last position
    out = np.empty((1, args.vocab), dtype=np.float32)
    junk = torch.zeros(int(args.flush_mb * 2 ** 20 / 4))
    flush = lambda: junk.add_(1.0)  # noqa: E731
    cpu = bank.cpu

    print(f"CpuBank.step, N={args.n} d={args.d} V={args.vocab}, median µs of {args.repeats} "
          f"(cold: {args.flush_mb:g} MB written before each call)")
    print(f"{'case':34s} {'warm':>8s} {'cold':>8s}")
    for label, hi in (("empty bank (call only)", 0), ("16 prototypes (+ bias add)", 16),
                      (f"{args.n} prototypes (full scan)", args.n)):
        while bank.hi < hi:                           # the books own the extent: hand out slots up to hi
            bank.books.allocate(bank.tenant)
        step = lambda: cpu.step(h, z, out)  # noqa: E731
        print(f"{label:34s} {median_us(step, args.repeats):8.2f} {median_us(step, args.repeats, flush):8.2f}")
    step_np = lambda: cpu.step(h.numpy(), z.numpy(), out)  # noqa: E731
    print(f"{'full scan, h/z via Tensor.numpy()':34s} {median_us(step_np, args.repeats):8.2f} "
          f"{median_us(step_np, args.repeats, flush):8.2f}")


if __name__ == "__main__":
    main()
