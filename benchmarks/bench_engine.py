"""The harness's own overhead, and measured vs predicted speedup (a benchmark, not a test).

For `ar` and `vanilla` on one stream it reports the share of iteration time spent outside the two
models' forward passes (draft loop bookkeeping, the acceptance rule, cache cropping, the method
hooks), the cost ratio c, and the measured speedup next to the i.i.d. prediction
(1 - α^(γ+1)) / ((1 - α)(γc + 1)).

    python benchmarks/bench_engine.py --zoo small --scenario indist --max-prompts 10
    python benchmarks/bench_engine.py --draft D --target T --corpus FILE
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default="small")
    ap.add_argument("--draft")
    ap.add_argument("--target")
    ap.add_argument("--scenario", default="indist")
    ap.add_argument("--corpus")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--methods", default="vanilla")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from drift_cli.bench import BenchConfig, run_bench
    from drift_cli.console import quiet_libraries

    quiet_libraries()
    cfg = BenchConfig(scenario=None if args.corpus else args.scenario, corpus=args.corpus, methods=args.methods,
                      zoo=args.zoo, draft=args.draft, target=args.target, split=args.split,
                      max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                      control=False)
    run, _ = run_bench(cfg)
    rows = {}
    for name, m in run["methods"].items():
        rows[name] = {k: m.get(k) for k in ("harness_overhead_pct", "overhead_pct", "acceptance_rate", "cost_ratio",
                                             "speedup", "predicted_speedup", "p50_step_ms", "tokens_per_s")}
        if m.get("speedup") and m.get("predicted_speedup"):
            rows[name]["measured_over_predicted"] = m["speedup"] / m["predicted_speedup"]
    summary = {"scenario": run["scenario"], "prompts": run["config"]["prompts"], "gamma": args.gamma,
               "hardware": run["env"]["hardware"], "models": run["models"], "methods": rows}
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        return
    t = Table(title=f"engine overhead: {run['scenario']} ({args.split}), {run['config']['prompts']} prompts, γ={args.gamma}")
    cols = ["harness_overhead_pct", "acceptance_rate", "cost_ratio", "speedup", "predicted_speedup",
            "measured_over_predicted", "p50_step_ms", "tokens_per_s"]
    t.add_column("method")
    for c in cols:
        t.add_column(c, justify="right")
    for name, r in rows.items():
        t.add_row(name, *("–" if r.get(c) is None else f"{r[c]:.3f}" for c in cols))
    Console(width=200).print(t)
    print(f"hardware: {run['env']['hardware']}")


if __name__ == "__main__":
    main()
