"""Bank bookkeeping benchmark (a benchmark, not a test).

1. Books: the same operation stream through the Rust books (`drift_cli._bank.Books`) and through
   a pure-Python `OrderedDict` equivalent with the same semantics and bookkeeping (free stack,
   global LRU eviction, all-or-nothing batched touch, slot owners, per-tenant counters). The
   stream imitates DRIFT at N slots: after filling the bank, each iteration touches a batch of
   retrieved slots (k=4 neighbours x γ=4 drafted positions = 16 for one sequence; more for
   batched serving) and allocates 0-2 new prototypes (evicting the LRU). The Rust books get each
   iteration as two calls, `touch(batch)` (a Python list, as `tensor.tolist()` gives, or an int64
   numpy row) and `allocate_many(n)`; the unbatched row makes one call per slot and allocation.
   Every implementation must end in the same LRU order.
2. Snapshots: save (temp file + fsync + rename) and load (read + checksum + checks + numpy
   copies) of a bank with N=4096, d=2048, m=32, in MB/s, beside a plain write+fsync / read of the
   same number of bytes (the disk's speed) and the `safetensors` package's own save/load.

    python benchmarks/bench_bank.py                       # ~1M operations, snapshot 4096x2048x32
    python benchmarks/bench_bank.py --operations 100000 --touch-batch 16 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from drift_cli import _bank


@dataclass
class StreamConfig:
    capacity: int = 4096
    iterations: int = 50_000
    touch_batch: int = 16      # k=4 neighbours x γ=4 drafted positions
    max_allocations: int = 2   # new prototypes per iteration: 0, 1 or 2
    seed: int = 0


@dataclass
class TenantCounters:
    hits: int = 0
    allocations: int = 0
    evictions: int = 0


class OrderedDictBooks:
    """The pure-Python equivalent of shared (quota-free) books: global LRU in an OrderedDict
    (slot -> owning tenant), the same free-stack order, per-tenant counters."""

    def __init__(self, capacity: int) -> None:
        self.order: OrderedDict[int, str] = OrderedDict()  # used slots, LRU first -> owner
        self.free = list(range(capacity))[::-1]
        self.tenants: dict[str, TenantCounters] = {}

    def allocate(self, tenant: str = "default") -> tuple[int, bool]:
        counters = self.tenants.get(tenant) or self.tenants.setdefault(tenant, TenantCounters())
        if self.free:
            slot, evicted = self.free.pop(), False
        else:
            slot, loser = self.order.popitem(last=False)
            self.tenants[loser].evictions += 1
            evicted = True
        self.order[slot] = tenant
        counters.allocations += 1
        return slot, evicted

    def allocate_many(self, count: int, tenant: str = "default") -> list[tuple[int, bool]]:
        return [self.allocate(tenant) for _ in range(count)]

    def touch(self, slots: list[int]) -> None:
        order = self.order
        for s in slots:
            if s not in order:
                raise KeyError(s)
        for s in slots:
            order.move_to_end(s)
            self.tenants[order[s]].hits += 1

    def recency(self) -> list[int]:
        return list(self.order)


def make_stream(cfg: StreamConfig) -> tuple[list[list[int]], np.ndarray, list[int]]:
    """Touch batches (as lists and as one [iterations, batch] int64 array) and allocation counts."""
    rng = np.random.default_rng(cfg.seed)
    # Retrieval favours recent prototypes: a skewed draw over slot ids keeps the LRU order moving.
    batches = (rng.zipf(1.3, size=(cfg.iterations, cfg.touch_batch)) - 1) % cfg.capacity
    batches = batches.astype(np.int64)
    allocs = rng.integers(0, cfg.max_allocations + 1, size=cfg.iterations).tolist()
    return batches.tolist(), batches, allocs


def run_stream(books, batches, allocs, unbatched: bool = False) -> float:
    start = time.perf_counter()
    if unbatched:
        for batch, n_alloc in zip(batches, allocs, strict=True):
            for s in batch:
                books.touch((s,))
            for _ in range(n_alloc):
                books.allocate()
    else:
        for batch, n_alloc in zip(batches, allocs, strict=True):
            books.touch(batch)
            books.allocate_many(n_alloc)
    return time.perf_counter() - start


def bench_books(cfg: StreamConfig, repeats: int) -> dict:
    lists, array, allocs = make_stream(cfg)
    ops = sum(len(b) for b in lists) + sum(allocs)
    results: dict[str, float] = {}
    finals: dict[str, list[int]] = {}
    variants = {
        "python_ordereddict": (OrderedDictBooks, lists, False),
        "rust_list_batches": (_bank.Books, lists, False),
        "rust_numpy_batches": (_bank.Books, list(array), False),
        "rust_unbatched": (_bank.Books, lists, True),
    }
    for name, (cls, batches, one_by_one) in variants.items():
        times = []
        for _ in range(repeats):
            books = cls(cfg.capacity)
            for _ in range(cfg.capacity):  # fill the bank; not timed
                books.allocate()
            times.append(run_stream(books, batches, allocs, one_by_one))
            finals[name] = books.recency()
        results[name] = min(times)
    assert all(f == finals["python_ordereddict"] for f in finals.values()), "implementations disagree"
    py = results["python_ordereddict"]
    return {
        "config": asdict(cfg), "operations": ops, "seconds": results,
        "mops_per_s": {k: ops / v / 1e6 for k, v in results.items()},
        "speedup_vs_python": {k: py / v for k, v in results.items() if k != "python_ordereddict"},
    }


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_snapshot(n: int, d: int, m: int, directory: Path, repeats: int) -> dict:
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    arrays = {"keys": rng.standard_normal((n, d), dtype=np.float32),
              "support": rng.integers(0, 150_000, (n, m), dtype=np.int64),
              "bias": rng.standard_normal((n, m), dtype=np.float32),
              "counts": rng.integers(0, 100, n, dtype=np.int32)}
    books = _bank.Books(n)
    for _ in range(n):
        books.allocate()
    books.touch(rng.permutation(n).tolist())
    meta = {"draft_fingerprint": "sha256:bench", "config": json.dumps({"N": n, "d": d, "m": m})}
    path = directory / "bench_bank.safetensors"
    raw = directory / "bench_raw.bin"
    save_s = _median_seconds(lambda: _bank.save_snapshot(path, books, arrays, meta), repeats)
    load_s = _median_seconds(lambda: _bank.load_snapshot(path, expect_draft="sha256:bench"), repeats)
    size = path.stat().st_size
    payload = os.urandom(size)

    def raw_write() -> None:
        with open(raw, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    raw_write_s = _median_seconds(raw_write, repeats)
    raw_read_s = _median_seconds(lambda: raw.read_bytes(), repeats)
    st_path = directory / "bench_st.safetensors"
    st_save_s = _median_seconds(lambda: save_file(arrays, str(st_path)), repeats)
    st_load_s = _median_seconds(lambda: load_file(str(st_path)), repeats)
    for p in (path, raw, st_path):
        p.unlink(missing_ok=True)
    mb = size / 1e6
    return {
        "N": n, "d": d, "m": m, "file_mb": mb, "repeats": repeats, "directory": str(directory),
        "mb_per_s": {"bank_save_fsync": mb / save_s, "bank_load_checked": mb / load_s,
                     "raw_write_fsync": mb / raw_write_s, "raw_read": mb / raw_read_s,
                     "safetensors_save_no_fsync": mb / st_save_s, "safetensors_load": mb / st_load_s},
        "seconds": {"bank_save": save_s, "bank_load": load_s},
    }


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for b in result["books"]:
        t = Table(title=f"books: {b['operations']:,} operations (N={b['config']['capacity']}, "
                        f"touch batch {b['config']['touch_batch']})")
        for col in ("implementation", "seconds", "M ops/s", "x python"):
            t.add_column(col, justify="right" if col != "implementation" else "left")
        for name, secs in b["seconds"].items():
            ratio = b["speedup_vs_python"].get(name)
            t.add_row(name, f"{secs:.3f}", f"{b['mops_per_s'][name]:.2f}",
                      "1.0" if ratio is None else f"{ratio:.1f}")
        console.print(t)
    s = result["snapshot"]
    t = Table(title=f"snapshot N={s['N']} d={s['d']} m={s['m']}: {s['file_mb']:.1f} MB in {s['directory']}")
    t.add_column("operation")
    t.add_column("MB/s", justify="right")
    for name, rate in s["mb_per_s"].items():
        t.add_row(name, f"{rate:,.0f}")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--operations", type=int, default=1_000_000, help="approximate operations per stream")
    ap.add_argument("--touch-batch", default="16,128", help="touch batch sizes (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--snapshot", default="4096,2048,32", help="N,d,m of the snapshot benchmark")
    ap.add_argument("--dir", type=Path, default=None, help="directory for snapshot files (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configs = [StreamConfig(capacity=args.capacity, iterations=args.operations // (b + 1), touch_batch=b)
               for b in (int(x) for x in args.touch_batch.split(","))]
    n, d, m = (int(x) for x in args.snapshot.split(","))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = {"books": [bench_books(cfg, args.repeats) for cfg in configs],
                  "snapshot": bench_snapshot(n, d, m, Path(tmp), max(args.repeats, 5))}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        render(result)


if __name__ == "__main__":
    main()
