"""OSD's re-prefill of a draft's cache after a weight change (a benchmark, not a test).

When an update changes weights below the draft's KV cache (sync OSD's AdamW steps, async OSD's
swap), every row's draft cache is rebuilt over its committed context, on the decode path. This
times, for contexts of the lengths given, on the zoo's layer draft and (`--drafter eagle`) its
EAGLE head:

- `forward`: a full forward over every position, logits included (what a re-prefill cost before
  `refill_row` computed the cache alone);
- `refill`:  `refill_row` as the engine runs it (the layer draft: the forward without the logits;
  a head: the keys/values of every pair but the last, and the last pair whole);
- `step`:    one draft step (one token after the context), for scale.

Median of --reps, one row, the thread count given (1 by default, the decoding thread of the
2-core CPU).

    python benchmarks/bench_refill.py --zoo smollm
    python benchmarks/bench_refill.py --zoo smollm --drafter eagle --lengths 128,256,384
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", default="smollm")
    ap.add_argument("--drafter", choices=["layer", "eagle"], default="layer")
    ap.add_argument("--lengths", default="128,256,384", help="context lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    from drift_cli import bench
    from drift_cli.bench_config import BenchConfig
    from drift_cli.engine.lm import CausalLM
    from drift_cli.methods.base import draft_lm

    cfg = BenchConfig.from_options({"zoo": args.zoo, "drafter": args.drafter, "threads": args.threads,
                                    "methods": "vanilla", "control": False})
    cfg.validate()
    pair = bench.load_models(cfg).pair
    lm = draft_lm(pair.draft)
    target = CausalLM(pair.target, "target")
    layers = getattr(lm, "target_layers", ())
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(0, pair.target.config.vocab_size, (n + 4,), generator=g)
        if layers:                                             # a head reads the target's states
            target.capture(layers)
            target.reset()
            target.forward(ids[None, :n])
            lm.reset_rows(1)
            lm.add_features(0, target.features[0, :n - 1])
        else:
            lm.reset_rows(1)

        def timed(fn) -> float:
            out = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(out)

        def forward() -> None:                                 # the old re-prefill: every position's logits
            lm.reset_rows(1) if not layers else _restart(lm)
            lm.forward_rows([0], [ids[1:n - 1] if layers else ids[:n - 1]])

        def refill() -> None:
            lm.refill_row(0, ids[:n])

        def step() -> None:
            if layers:
                lm.rows.lengths[0] = lm.real[0] = n - 2
            else:
                lm.crop(n - 1)
            lm.forward_rows([0], [ids[n - 1:n]])

        f, r = timed(forward), timed(refill)
        lm.refill_row(0, ids[:n])
        s = timed(step)
        rows.append({"context": n, "forward_ms": f, "refill_ms": r, "step_ms": s})

    meta = {"zoo": args.zoo, "drafter": args.drafter, "threads": args.threads, "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    t = Table(title=f"re-prefill of one row's draft cache ({args.zoo}, {args.drafter}, {args.threads} thread(s), median of {args.reps})")
    for c in ("context", "forward ms (logits too)", "refill_row ms", "ratio", "draft step ms"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["context"]), f"{r['forward_ms']:.1f}", f"{r['refill_ms']:.1f}",
                  f"{r['forward_ms'] / r['refill_ms']:.2f}x", f"{r['step_ms']:.2f}")
    Console().print(t)


def _restart(lm) -> None:
    """A head's row back to no pairs, its known target states kept (what refill_row starts from)."""
    lm.rows.lengths[0] = lm.real[0] = 0
    lm._carry[0] = None


if __name__ == "__main__":
    main()
