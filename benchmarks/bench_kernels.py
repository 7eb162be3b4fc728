"""Retrieval + bias add time per draft token: Triton kernels vs the PyTorch reference.

    python benchmarks/bench_kernels.py [--n 4096] [--d 2048] [--m 32] [--vocab 32000 128256]
                                       [--queries 1] [--out results/gpu/bench_kernels.json]

On a GPU both paths are timed with `triton.testing.do_bench` (median and 20/80% quantiles, ms).
On a CPU the reference and the Rust CPU path run (timed with perf_counter, median of repeats)
and the output says so: interpreter timings of the kernels mean nothing. Keys are fp16 on the GPU, fp32 on the CPU.
The performance target: under 20 µs per draft token at N=4096, d=2048, m=32 on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import drift_kernels  # noqa: E402
from drift_kernels import reference  # noqa: E402


def make_case(n, d, m, v, q, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(0)
    keys = reference.unit_rows(torch.randn(n, d, generator=g)).to(device=device, dtype=dtype)
    valid = torch.ones(n, dtype=torch.bool, device=device)
    support = torch.randint(0, v, (n, m), generator=g, dtype=torch.int32).to(device)
    bias = torch.randn(n, m, generator=g).to(device)
    h = torch.randn(q, d, generator=g).to(device=device, dtype=dtype)
    z = torch.randn(q, v, generator=g).to(device)
    return h, keys, valid, support, bias, z


def step(case, backend, k=4, sigma=0.5, gain=0.6):
    h, keys, valid, support, bias, z = case
    nb = drift_kernels.retrieve(h, keys, valid, k, sigma, backend=backend)
    return drift_kernels.bias_add(z, nb, support, bias, gain, backend=backend)


def time_cpu(fn, repeats=20):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "repeats": repeats}


def time_gpu(fn):
    import triton.testing
    med, lo, hi = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    return {"median_ms": med, "p20_ms": lo, "p80_ms": hi}


def bench(args) -> dict:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    rows = []
    for v in args.vocab:
        case = make_case(args.n, args.d, args.m, v, args.queries, device, dtype)
        row = {"vocab": v, "queries": args.queries}
        if cuda:
            exact = torch.equal(step(case, "triton"), step(case, "reference"))
            row["triton"] = time_gpu(lambda: step(case, "triton"))
            row["reference"] = time_gpu(lambda: step(case, "reference"))
            row["triton_equals_reference"] = exact
        else:
            row["reference"] = time_cpu(lambda: step(case, "reference"))
            row["cpu"] = time_cpu(lambda: step(case, "cpu"))        # the Rust CPU path (drift_kernels.cpu)
            # not bit-equal: the similarities (hence weights) round differently; the bias add itself is
            row["cpu_max_abs_diff_vs_reference"] = float((step(case, "cpu") - step(case, "reference")).abs().max())
        for path in ("triton", "reference", "cpu"):
            if path in row:
                row[path]["us_per_draft_token"] = row[path]["median_ms"] * 1e3 / args.queries
        rows.append(row)
    return {
        "benchmark": "drift retrieval + bias add per draft token",
        "shape": {"N": args.n, "d": args.d, "m": args.m, "k": 4},
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "key_dtype": str(dtype).removeprefix("torch."),
        "note": None if cuda else "no GPU: the PyTorch reference and the Rust CPU path only, Triton kernels not timed",
        "versions": {"torch": torch.__version__, "triton": _triton_version()},
        "rows": rows,
    }


def _triton_version():
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001
        return None


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    ap.add_argument("--queries", type=int, default=1, help="query positions per call (1 = one draft token)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    with torch.inference_mode():
        result = bench(args)
    text = json.dumps(result, indent=2)
    if args.out:
        write_atomic(args.out, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
