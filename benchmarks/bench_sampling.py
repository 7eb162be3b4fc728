"""The sampling path of one speculative iteration at a large vocabulary, full sort vs nucleus.

    python benchmarks/bench_sampling.py [--vocab 49152] [--gamma 4] [--temperature 0.7] [--top-p 0.9]
                                        [--logits flat,flatter,peaked,zipf,real] [--repeats 50]

One iteration at batch 1 samples `gamma` draft tokens (`Sampler.pick` on one row each) and
computes the target's distributions at gamma + 1 positions (`Sampler.probs`). `full sort` is the
reference (a full-vocabulary sort per row, then a softmax over the masked vocabulary); `nucleus`
is the current implementation (`drift_cli.engine.sampling`). The logits, gamma + 1 rows:
`flat` standard Gaussian (at T 0.7 / top-p 0.9 the nucleus is ~45% of V), `flatter` Gaussian
x 0.3 (~80% of V: the second guess is spent for nothing, the worst case), `peaked` Gaussian x 6,
`zipf` a Zipf law (logit -log rank, each row its own permutation, plus Gaussian noise x 0.5),
`real` the installed SmolLM2-135M target (the `smollm` preset's GGUF, dequantised and cached) on
a line of English. One torch thread; medians of CPU time (`time.process_time`, so that other jobs
on a shared machine count less) in ms per iteration, the two implementations timed in turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drift_cli.engine.sampling import Sampler  # noqa: E402


def full_sort_probs(z: torch.Tensor, top_p: float) -> torch.Tensor:
    ranked, order = torch.sort(z, dim=-1, descending=True)
    p = torch.softmax(ranked, dim=-1)
    drop = torch.zeros_like(ranked, dtype=torch.bool).scatter(-1, order, (p.cumsum(-1) - p) >= top_p)
    return torch.softmax(z.masked_fill(drop, float("-inf")), dim=-1)


def real_logits(n: int) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drift_cli import gguf
    from drift_cli.zoo.presets import PRETRAINED
    from drift_cli.zoo.pretrained import target_file

    directory, _ = gguf.checkpoint(target_file(PRETRAINED["smollm"]), "target")
    tok = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tok.encode(text)])).logits[0, -n:]


def synthetic_logits(kind: str, n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "zipf":
        rank = torch.stack([torch.randperm(vocab, generator=g) for _ in range(n)]) + 1
        return -rank.double().log().float() + torch.randn(n, vocab, generator=g) * 0.5
    return torch.randn(n, vocab, generator=g) * {"flat": 1.0, "flatter": 0.3, "peaked": 6.0}[kind]


def iteration_ms(fns, repeats: int) -> list[float]:
    """Median ms of each function, run in turn (so a load that comes and goes hits all alike)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.process_time()
            fn()
            ts.append((time.process_time() - t) * 1e3)
    return [statistics.median(ts) for ts in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--logits", default="flat,flatter,peaked,zipf", help="comma-separated: flat, flatter, peaked, zipf, real")
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    n = a.gamma + 1
    print(f"V={a.vocab} (real: the model's) gamma={a.gamma} T={a.temperature} top-p={a.top_p}; torch {torch.__version__}")
    print("| logits | nucleus sizes | full sort ms | nucleus ms | nucleus / full sort |")
    print("|---|---|---|---|---|")
    for kind in a.logits.split(","):
        raw = real_logits(n) if kind == "real" else synthetic_logits(kind, n, a.vocab)
        s = Sampler(a.temperature, a.top_p, torch.Generator().manual_seed(0))
        z = s.sampling_logits(raw)                                # [gamma + 1, V]

        def old() -> None:
            for t in range(a.gamma):
                torch.multinomial(full_sort_probs(z[t:t + 1], a.top_p), 1, generator=s.generator)
            full_sort_probs(z, a.top_p)

        def new() -> None:
            for t in range(a.gamma):
                s.pick(z[t:t + 1])
            s.probs(z)

        sizes = [int((s.probs(z[t:t + 1]) > 0).sum()) for t in range(n)]
        o, w = iteration_ms([old, new], a.repeats)
        print(f"| {kind} | {', '.join(map(str, sizes))} | {o:.1f} | {w:.1f} | {w / o:.2f} |")


if __name__ == "__main__":
    main()
