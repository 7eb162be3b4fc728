"""The cost of batching in the harness itself (a benchmark, not a test).

For each batch size B it runs the stream through one method with `--batch-size B` and reports,
per iteration, the harness time outside both models' forward passes (ragged proposal fitting,
the acceptance rule, per-row rollback, masks and per-row KV writes charged inside no forward
span, the method hooks), next to the forward passes' own time, and the ratio of that outside
time to B = 1's. Iteration times are the rows' shares summed back (`metrics.iteration_times_ms`).

    python benchmarks/bench_batch.py --zoo micro --max-prompts 16 --max-new-tokens 32
    python benchmarks/bench_batch.py --zoo smollm --methods vanilla,drift --sizes 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table


def outside_ms_per_iteration(steps) -> tuple[float, float, int]:
    """(harness ms outside the forward passes, forward ms) per iteration, and the iterations."""
    iterations = len({s.step for s in steps})
    total = sum(s.total_ms for s in steps)
    fwd = sum(s.forward_draft_ms + s.forward_target_ms for s in steps)
    return (total - fwd) / iterations, fwd / iterations, iterations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default="micro")
    ap.add_argument("--scenario", default="jargon")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--methods", default="ar,vanilla,drift,pld")
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from drift_cli import bench
    from drift_cli.console import quiet_libraries

    quiet_libraries()
    sizes = [int(x) for x in args.sizes.split(",")]
    names = [n.strip() for n in args.methods.split(",")]
    cfg = bench.BenchConfig(scenario=args.scenario, methods=args.methods, zoo=args.zoo, split=args.split,
                            max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                            control=False)
    cfg.validate()
    models = bench.load_models(cfg)
    stream = bench.load_stream(cfg, models.pair.tokenizer, bench.resolve_scenario(cfg))
    rows = []
    base: dict[str, float] = {}
    for b in sizes:
        from dataclasses import replace

        runs, _, _ = bench.run_methods(names, models, stream, replace(cfg, batch_size=b))
        for name, run in runs.items():
            outside, fwd, iterations = outside_ms_per_iteration(run.steps)
            base.setdefault(name, outside)
            rows.append({"batch_size": b, "method": name, "iterations": iterations, "outside_ms_per_iteration": outside,
                         "forward_ms_per_iteration": fwd, "outside_vs_b1": outside / base[name],
                         "outside_share_pct": 100 * outside / (outside + fwd)})
    if args.json:
        json.dump({"zoo": args.zoo, "scenario": args.scenario, "prompts": len(stream.prompts), "gamma": args.gamma,
                   "rows": rows}, sys.stdout, indent=2)
        return
    t = Table(title=f"harness time outside the forward passes per iteration: zoo {args.zoo}, {args.scenario}, "
                    f"{len(stream.prompts)} prompts x {stream.max_new_tokens} tokens, γ={args.gamma}")
    for col in ("B", "method", "iterations", "outside ms/iter", "forward ms/iter", "outside vs B=1", "outside %"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["batch_size"]), r["method"], str(r["iterations"]), f"{r['outside_ms_per_iteration']:.3f}",
                  f"{r['forward_ms_per_iteration']:.3f}", f"{r['outside_vs_b1']:.2f}x", f"{r['outside_share_pct']:.1f}")
    Console().print(t)


if __name__ == "__main__":
    main()
