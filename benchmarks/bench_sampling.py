"""The sampling path of one speculative iteration at a large vocabulary, full sort vs nucleus.

    python benchmarks/bench_sampling.py [--vocab 49152] [--gamma 4] [--temperature 0.7] [--top-p 0.9]
                                        [--logits real|synthetic] [--repeats 50]

One iteration at batch 1 samples `gamma` draft tokens (`Sampler.pick` on one row each) and
computes the target's distributions at gamma + 1 positions (`Sampler.probs`). `full sort` is the
previous implementation (a full-vocabulary sort per row, then a softmax over the masked
vocabulary); `nucleus` is the current one (`drift_cli.engine.sampling`). With `--logits real`
the logits come from the installed SmolLM2-135M target (the `smollm` preset's GGUF, dequantised
and cached) on a line of English; `synthetic` uses Gaussian logits scaled to a similar
peakedness. One torch thread; medians in ms per iteration.
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


def iteration_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--logits", choices=["real", "synthetic"], default="synthetic")
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    n = a.gamma + 1
    raw = real_logits(n) if a.logits == "real" else torch.randn(n, a.vocab, generator=torch.Generator().manual_seed(0)) * 6
    s = Sampler(a.temperature, a.top_p, torch.Generator().manual_seed(0))
    z = s.sampling_logits(raw)                                    # [gamma + 1, V]

    def old() -> None:
        for t in range(a.gamma):
            torch.multinomial(full_sort_probs(z[t:t + 1], a.top_p), 1, generator=s.generator)
        full_sort_probs(z, a.top_p)

    def new() -> None:
        for t in range(a.gamma):
            s.pick(z[t:t + 1])
        s.probs(z)

    sizes = [int((s.probs(z[t:t + 1]) > 0).sum()) for t in range(n)]
    print(f"V={raw.shape[-1]} gamma={a.gamma} T={a.temperature} top-p={a.top_p} logits={a.logits}; "
          f"nucleus sizes {sizes}")
    o, w = iteration_ms(old, a.repeats), iteration_ms(new, a.repeats)
    print(f"full sort: {o:.2f} ms/iteration   nucleus: {w:.2f} ms/iteration   ({o / w:.1f}x)")


if __name__ == "__main__":
    main()
