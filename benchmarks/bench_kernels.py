"""Retrieval + bias add time per draft token: the fused Triton draft step vs the PyTorch reference.

    python benchmarks/bench_kernels.py [--n 4096] [--d 576 2048 4096] [--m 32] [--k 4]
                                       [--vocab 32000 128256] [--queries 1] [--json FILE]
    python benchmarks/bench_kernels.py --quick [--json FILE]   # CPU, TRITON_INTERPRET=1, toy shapes

On a GPU (keys fp16) each shape reports, per draft token (one query row, k neighbours):
  * `triton_us`: `drift_kernels.draft_step` called from Python (host work included: two launches,
    four `torch.empty`), timed with `triton.testing.do_bench` (median);
  * `triton_graph_us`: the same step replayed from a CUDA graph (device time plus one graph
    launch; `graph_baseline_us` is the replay of a graph of one tiny kernel);
  * `triton_device_us`: the kernels' own device time (torch.profiler; `kernels_us` per kernel),
    what the step adds inside the draft's captured graph;
  * `reference_us`: `reference.retrieve` + `reference.bias_add`;
  * `floor_us`: the keys' bytes over the device's measured copy bandwidth (a `torch` copy of the
    same bytes: 2·bytes / time), the time just to read the keys once;
  * the largest differences from the reference (`max_abs_diff`: logits, similarities, weights),
    whether the retrieved slots are identical, and whether the bias add of the kernel's own
    neighbours equals the reference bit for bit (docs/drift.md, "Exactness").
`--quick` runs the same comparison on the CPU under the Triton interpreter at toy shapes (a
smoke test of this script and of the kernels; its timings mean nothing). Without a GPU and
without `--quick`, the reference and the Rust CPU path are timed instead. The bar: at most 20 µs
per draft token at N=4096, d=2048, m=32, k=4 on an H100/H200.
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

BAR_US = 20.0
QUICK = {"n": 70, "d": [24, 40], "m": 4, "k": 4, "vocab": [100], "queries": 1}


def make_case(n, d, m, v, q, device, dtype):
    from drift_kernels import reference
    g = torch.Generator(device="cpu").manual_seed(0)
    keys = reference.unit_rows(torch.randn(n, d, generator=g)).to(device=device, dtype=dtype)
    valid = torch.ones(n, dtype=torch.bool, device=device)
    support = torch.stack([torch.randperm(v, generator=g)[:m] for _ in range(n)]).to(device)   # unique per row
    bias = torch.randn(n, m, generator=g).to(device)
    h = torch.randn(q, d, generator=g).to(device=device, dtype=dtype)
    z = torch.randn(q, v, generator=g).to(device)
    return h, z, keys, valid, support, bias


def step(case, backend, k, sigma=0.5, gain=0.6):
    import drift_kernels
    h, z, keys, valid, support, bias = case
    return drift_kernels.draft_step(h, z, keys, valid, support, bias, k, sigma, gain, backend=backend)


def compare(case, k) -> dict:
    """The Triton step against the reference: largest differences, identical slots, exact bias add."""
    from drift_kernels import reference
    got, nb = step(case, "triton", k)
    want, want_nb = step(case, "reference", k)
    h, z, keys, valid, support, bias = case
    live = want_nb.idx >= 0
    return {
        "max_abs_diff": {
            "logits": float((got - want).abs().max()),
            "similarity": float((nb.sim[live] - want_nb.sim[live]).abs().max()) if bool(live.any()) else 0.0,
            "weight": float((nb.weight - want_nb.weight).abs().max()),
        },
        "same_slots": bool(torch.equal(nb.idx, want_nb.idx)),
        "bias_add_bit_exact": bool(torch.equal(got, reference.bias_add(z, nb, support, bias, 0.6))),
        "triton_equals_reference": bool(torch.equal(got, want)),
    }


def time_cpu(fn, repeats=20):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def time_gpu(fn):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def time_graph(fn):
    """Median ms of one replay of fn captured in a CUDA graph."""
    import triton.testing
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def device_us(fn, calls=30) -> dict:
    """Device time per call of each kernel fn launches (torch.profiler), with the L2 flushed
    before every call as do_bench does, so the keys come from memory."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.endswith("_kernel"):                # ours; not the flush
            out[e.key] = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    return {name: total / calls for name, total in out.items()}


def graph_baseline_us() -> float:
    """One replay of a graph holding one tiny kernel: the timing's own floor."""
    x = torch.zeros(1, device="cuda")
    return time_graph(lambda: x.add_(1)) * 1e3


def copy_floor_us(nbytes: int, device) -> dict:
    """Device copy bandwidth on a buffer of nbytes, and the time to read nbytes at it."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_gpu(lambda: dst.copy_(src))
    bandwidth = 2 * nbytes / (ms * 1e-3)                          # read + write, bytes per second
    return {"copy_GBps": bandwidth / 1e9, "floor_us": nbytes / bandwidth * 1e6}


def bench_gpu(args) -> list:
    from drift_kernels import retrieval
    rows = []
    for d in args.d:
        for v in args.vocab:
            case = make_case(args.n, d, args.m, v, args.queries, "cuda", torch.float16)
            row = {"N": args.n, "d": d, "m": args.m, "k": args.k, "vocab": v, "queries": args.queries}
            row.update(compare(case, args.k))
            per = 1e3 / args.queries
            row["triton_us"] = time_gpu(lambda: step(case, "triton", args.k)) * per
            row["triton_graph_us"] = time_graph(lambda: step(case, "triton", args.k)) * per
            row["kernels_us"] = {name: us / args.queries for name, us in
                                 device_us(lambda: step(case, "triton", args.k)).items()}
            row["triton_device_us"] = sum(row["kernels_us"].values())
            row["reference_us"] = time_gpu(lambda: step(case, "reference", args.k)) * per
            row.update(copy_floor_us(case[2].numel() * case[2].element_size(), "cuda"))
            row["launches_per_step"] = 2
            if args.sweep and (d, v) == (2048 if 2048 in args.d else args.d[0], args.vocab[0]):
                row["sweep"] = sweep(case, args.k, per, retrieval)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def sweep(case, k, per, retrieval) -> list:
    """Tile shapes of the retrieval launch (module constants), each timed eager and replayed."""
    saved = (retrieval.BLOCK_N, retrieval.MAX_BLOCK_D, retrieval.NUM_WARPS)
    out = []
    try:
        for bn in (8, 16, 32):
            for bd in (256, 512):
                for warps in (4, 8):
                    retrieval.BLOCK_N, retrieval.MAX_BLOCK_D, retrieval.NUM_WARPS = bn, bd, warps
                    try:
                        out.append({"BLOCK_N": bn, "MAX_BLOCK_D": bd, "num_warps": warps,
                                    "graph_us": time_graph(lambda: step(case, "triton", k)) * per})
                    except Exception as exc:  # noqa: BLE001 - an unfit configuration is a result
                        out.append({"BLOCK_N": bn, "MAX_BLOCK_D": bd, "num_warps": warps, "error": str(exc)[:200]})
    finally:
        retrieval.BLOCK_N, retrieval.MAX_BLOCK_D, retrieval.NUM_WARPS = saved
    return sorted(out, key=lambda r: r.get("graph_us", float("inf")))[:8]


def bench_quick(args) -> list:
    """Toy shapes under the interpreter: the comparison only (interpreter timings are not kept)."""
    rows = []
    for d in args.d:
        for v in args.vocab:
            case = make_case(args.n, d, args.m, v, args.queries, "cpu", torch.float32)
            row = {"N": args.n, "d": d, "m": args.m, "k": args.k, "vocab": v, "queries": args.queries}
            row.update(compare(case, args.k))
            rows.append(row)
    return rows


def bench_cpu(args) -> list:
    rows = []
    for d in args.d:
        for v in args.vocab:
            case = make_case(args.n, d, args.m, v, args.queries, "cpu", torch.float32)
            row = {"N": args.n, "d": d, "m": args.m, "k": args.k, "vocab": v, "queries": args.queries}
            per = 1e3 / args.queries
            row["reference_us"] = time_cpu(lambda: step(case, "reference", args.k)) * per
            row["cpu_us"] = time_cpu(lambda: step(case, "cpu", args.k)) * per      # the Rust path
            got, _ = step(case, "cpu", args.k)
            row["cpu_max_abs_diff_vs_reference"] = float((got - step(case, "reference", args.k)[0]).abs().max())
            rows.append(row)
    return rows


def bench(args) -> dict:
    cuda = torch.cuda.is_available() and not args.quick
    mode = "gpu" if cuda else "quick" if args.quick else "cpu"
    rows = {"gpu": bench_gpu, "quick": bench_quick, "cpu": bench_cpu}[mode](args)
    notes = {"gpu": "keys fp16; us per draft token; triton_us from Python (host work included), "
                    "triton_graph_us replayed from a CUDA graph",
             "quick": "TRITON_INTERPRET=1 on the CPU at toy shapes: agreement only, no timings",
             "cpu": "no GPU: the PyTorch reference and the Rust CPU path only, Triton kernels not timed"}
    result = {
        "benchmark": "drift retrieval + bias add per draft token",
        "mode": mode,
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "key_dtype": "float16" if cuda else "float32",
        "note": notes[mode],
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": _triton_version()},
        "rows": rows,
    }
    if cuda:
        result["graph_baseline_us"] = graph_baseline_us()
        at_bar = [r for r in rows if (r["N"], r["d"], r["m"]) == (4096, 2048, 32)]
        result["bar_us"] = BAR_US
        result["meets_bar"] = bool(at_bar) and all(r["triton_graph_us"] <= BAR_US for r in at_bar)
        result["meets_bar_device"] = bool(at_bar) and all(r["triton_device_us"] <= BAR_US for r in at_bar)
        result["meets_bar_eager"] = bool(at_bar) and all(r["triton_us"] <= BAR_US for r in at_bar)
    if rows and "max_abs_diff" in rows[0]:
        result["max_abs_diff_logits"] = max(r["max_abs_diff"]["logits"] for r in rows)
    return result


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


def summary(result: dict) -> str:
    lines = [f"{result['benchmark']} on {result['device']} ({result['mode']})"]
    for r in result["rows"]:
        head = f"N {r['N']} d {r['d']} m {r['m']} k {r['k']} V {r['vocab']}:"
        if "triton_us" in r:
            head += (f" triton {r['triton_us']:.1f} us (graph {r['triton_graph_us']:.1f}, device "
                     f"{r['triton_device_us']:.1f}), reference "
                     f"{r['reference_us']:.1f} us, floor {r['floor_us']:.1f} us")
        if "cpu_us" in r:
            head += f" reference {r['reference_us']:.1f} us, cpu {r['cpu_us']:.1f} us"
        if "max_abs_diff" in r:
            head += (f"; max |diff| logits {r['max_abs_diff']['logits']:.3g}, similarity "
                     f"{r['max_abs_diff']['similarity']:.3g}; same slots {r['same_slots']}; bias add bit-exact "
                     f"{r['bias_add_bit_exact']}")
        lines.append(head)
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[576, 2048, 4096])
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    ap.add_argument("--queries", type=int, default=1, help="query rows per call (1 = one draft token)")
    ap.add_argument("--quick", action="store_true", help="toy shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--sweep", action="store_true", help="also time other retrieval tile shapes (GPU)")
    ap.add_argument("--json", "--out", dest="json", type=Path, default=None, help="write the result here")
    args = ap.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, value)
        os.environ["TRITON_INTERPRET"] = "1"              # before any kernel module is imported
    with torch.inference_mode():
        result = bench(args)
    text = json.dumps(result, indent=2)
    if args.json:
        write_atomic(args.json, text + "\n")
    print(text)
    print(summary(result), file=sys.stderr)


if __name__ == "__main__":
    main()
