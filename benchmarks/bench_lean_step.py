"""The target's k-token step at batch 1: the one-call step against one call per fused piece.

    python benchmarks/bench_lean_step.py [--zoo smollm] [--threads 1] [--reps 9] [--k 1,2,4,8,16]

In one process, rep by rep interleaved: the weight-read floor (`drift_cli.engine.floor`), the
lean forward's one-call step (`DecoderPlan`, every layer in one Rust call) and the same forward
with one Rust call per fused piece (RMSNorm + q/k/v, attention, o_proj, MLP; the path rows and
trees take), for k tokens after a 200-position prefix, the cache cropped back after each. The
fastest rep of each is kept (wall ms). Interleaving in one process keeps a machine whose memory
speed drifts from favouring either side; `drift profile` gives the whole cost curve.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drift_cli.bench import load_models  # noqa: E402
from drift_cli.bench_config import BenchConfig  # noqa: E402
from drift_cli.engine import floor, lean  # noqa: E402
from drift_cli.engine.lm import CausalLM  # noqa: E402

PREFIX = 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", default="smollm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--k", default="1,2,4,8,16", help="token counts scored, comma-separated")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    torch.set_num_threads(args.threads)
    if lean._PLAN is None:
        sys.exit("the extension has no one-call step (DecoderPlan): rebuild it (make setup)")
    target = CausalLM(load_models(BenchConfig(zoo=args.zoo, threads=args.threads)).pair.target, "target")
    if target.lean is None:
        sys.exit("the lean forward does not serve this target (lean.supports)")
    vocab = target.head.vocab_size
    ids = torch.tensor([[(7919 * i + 11) % vocab for i in range(PREFIX + max(ks))]])
    tensors = floor.read_tensors(target)
    paths = {"one call": lean._PLAN, "per piece": None}
    best: dict = {}
    try:
        with torch.inference_mode():
            target.reset()
            target.forward(ids[:, :PREFIX])
            for _ in range(args.reps):
                best["floor"] = min(best.get("floor", float("inf")), floor.read_ms(tensors))
                for k in ks:
                    for name, plan in paths.items():
                        lean._PLAN = plan
                        t0 = time.perf_counter()
                        target.forward(ids[:, PREFIX:PREFIX + k])
                        ms = (time.perf_counter() - t0) * 1e3
                        target.crop(PREFIX)
                        best[name, k] = min(best.get((name, k), float("inf")), ms)
    finally:
        lean._PLAN = paths["one call"]
    f = best["floor"]
    print(f"{args.zoo} target, {args.threads} thread(s), fp32, fastest of {args.reps}: floor {f:.1f} ms")
    print(f"{'':10s}" + "".join(f"{'k=' + str(k):>8s}" for k in ks) + "  k1/floor  max(k<=8)/k1")
    for name in paths:
        k1 = best[name, ks[0]]
        top = max(best[name, k] for k in ks if k <= 8)
        print(f"{name:10s}" + "".join(f"{best[name, k]:8.1f}" for k in ks) + f"  {k1 / f:8.2f}  {top / k1:12.2f}")


if __name__ == "__main__":
    main()
