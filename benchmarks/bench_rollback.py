"""Per-row KV rollback at batch B: the harness's own cache against the padded alternative (a
benchmark, not a test).

docs/engine.md chose a cache with per-row positions (`RowCache`: rolling a row back sets its
length). The alternative keeps one physical length for every row (a concatenating cache, like
`DynamicCache`, with a 4D mask and per-row position ids): every iteration appends γ + 1 positions
to every row, and a row that accepted a of its γ drafts leaves γ - a masked holes that every later
forward attends over, unless a compaction (a gather of every layer's keys and values) removes
them. This script runs the same simulated stream through three caches:

- `row`:       `CausalLM.forward_rows` / `crop_rows` (what the engine runs at B > 1);
- `padded`:    one physical length, holes masked, never compacted;
- `compacted`: the same, compacted every `--compact-every` iterations (each row's valid
  positions gathered to the front, left-padded to the longest row).

Each iteration feeds every row γ + 1 tokens and accepts a ~ Geometric(α) of them (the same draws
for every cache); prompts are random tokens. It reports ms per iteration (the forward passes, and
the bookkeeping outside them: masks, compactions), the physical cache length at the end, and the
largest logit difference from `row` on the last iteration (the three must agree: same keys,
same positions, only the masked layout differs).

    python benchmarks/bench_rollback.py                       # a random-init model of small's shape
    python benchmarks/bench_rollback.py --zoo smollm --batch 8 --iterations 48
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from rich.console import Console
from rich.table import Table

from drift_cli.engine.lm import CausalLM


class PaddedCache:
    """One physical length for every row: keys/values concatenated per layer (DynamicCache's
    layout), compacted on demand by a per-row gather."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == len(self.keys):
            self.keys.append(key_states)
            self.values.append(value_states)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key_states], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value_states], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if not self.keys else self.keys[0].shape[2]

    def gather(self, index: torch.Tensor) -> None:
        """Keep, for row b, positions index[b] (in that order), for every layer."""
        at = index[:, None, :, None]
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                store[i] = t.gather(2, at.expand(-1, t.shape[1], -1, t.shape[3]))


class PaddedLM:
    """The padded alternative: `valid [B, L]` marks each row's committed positions."""

    def __init__(self, lm: CausalLM, compact_every: int | None) -> None:
        self.lm, self.compact_every = lm, compact_every
        self.cache, self.valid = PaddedCache(), None
        self.bookkeeping_ms = 0.0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        b, s = ids.shape
        old = 0 if self.valid is None else self.valid.shape[1]
        start = torch.zeros(b, dtype=torch.long) if self.valid is None else self.valid.sum(1)
        pos = start[:, None] + torch.arange(s)
        seen = torch.ones(b, s, s, dtype=torch.bool).tril()                     # the new block: causal
        past = (torch.ones(b, s, 0, dtype=torch.bool) if self.valid is None
                else self.valid[:, None, :].expand(b, s, old))                   # the past: its valid positions
        visible = torch.cat([past, seen], dim=2)
        dtype = self.lm.head.linear.weight.dtype
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
        self.bookkeeping_ms += (time.perf_counter() - t0) * 1e3
        out = self.lm.decoder(input_ids=ids, position_ids=pos, attention_mask=mask[:, None], use_cache=True,
                              **{self.lm._kw: self.cache})
        block = torch.ones(b, s, dtype=torch.bool)
        self.valid = block if self.valid is None else torch.cat([self.valid, block], dim=1)
        return self.lm.head(out.last_hidden_state)

    @torch.inference_mode()
    def commit(self, kept: list[int], block: int, iteration: int) -> None:
        """Row b keeps the first kept[b] positions of the `block` it was just fed; the rest are holes."""
        t0 = time.perf_counter()
        s = self.valid.shape[1]
        for r, k in enumerate(kept):
            self.valid[r, s - block + k:] = False
        if self.compact_every and (iteration + 1) % self.compact_every == 0:
            counts = self.valid.sum(1)
            longest = int(counts.max())
            # each row's valid positions, in order, left-padded (with a masked copy of position 0)
            order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :longest]
            shift = longest - counts
            idx = torch.zeros(len(kept), longest, dtype=torch.long)
            valid = torch.zeros(len(kept), longest, dtype=torch.bool)
            for r in range(len(kept)):
                n = int(counts[r])
                idx[r, int(shift[r]):] = order[r, :n]
                valid[r, int(shift[r]):] = True
            self.cache.gather(idx)
            self.valid = valid
        self.bookkeeping_ms += (time.perf_counter() - t0) * 1e3


def simulate(lm: CausalLM, kind: str, prompts: torch.Tensor, feeds: list[torch.Tensor], kept: list[list[int]],
             compact_every: int) -> dict:
    b = prompts.shape[0]
    slots = list(range(b))
    fwd = 0.0
    if kind == "row":
        lm.reset_rows(b)
        lm.forward_rows(slots, prompts)
        bookkeeping, logits = 0.0, None
        for ids, k in zip(feeds, kept, strict=True):
            t0 = time.perf_counter()
            _, logits = lm.forward_rows(slots, ids)
            fwd += (time.perf_counter() - t0) * 1e3
            t1 = time.perf_counter()
            lm.crop_rows(slots, [lm.row_len(s) - ids.shape[1] + n for s, n in zip(slots, k, strict=True)])
            bookkeeping += (time.perf_counter() - t1) * 1e3
        physical = max(lm.rows.lengths)
    else:
        p = PaddedLM(lm, compact_every if kind == "compacted" else None)
        p.forward(prompts)
        p.bookkeeping_ms = 0.0
        for i, (ids, k) in enumerate(zip(feeds, kept, strict=True)):
            t0 = time.perf_counter()
            before = p.bookkeeping_ms
            logits = p.forward(ids)
            fwd += (time.perf_counter() - t0) * 1e3 - (p.bookkeeping_ms - before)
            p.commit(k, ids.shape[1], i)
        bookkeeping, physical = p.bookkeeping_ms, p.valid.shape[1]
    n = len(feeds)
    return {"forward_ms": fwd / n, "bookkeeping_ms": bookkeeping / n, "total_ms": (fwd + bookkeeping) / n,
            "physical_length": physical, "logits": logits}


def model_for(zoo: str | None) -> torch.nn.Module:
    if zoo:
        from drift_cli.bench import BenchConfig, load_models

        return load_models(BenchConfig(zoo=zoo)).pair.target
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=704, max_position_embeddings=4096)
    return LlamaForCausalLM(cfg).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default=None, help="a zoo's target (default: a random-init model of small's shape)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.3, help="per-position acceptance of the simulated drafts")
    ap.add_argument("--compact-every", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="each cache runs this many times, interleaved; medians")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from drift_cli.console import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(args.threads)
    lm = CausalLM(model_for(args.zoo), "target")
    g = torch.Generator().manual_seed(0)
    vocab = lm.vocab_size
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=g)
    feeds = [torch.randint(0, vocab, (args.batch, args.gamma + 1), generator=g) for _ in range(args.iterations)]
    kept = []
    for _ in feeds:
        row = []
        for _b in range(args.batch):
            a = 0
            while a < args.gamma and torch.rand((), generator=g) < args.alpha:
                a += 1
            row.append(a + 1)            # the accepted drafts and the position before them stay cached
        kept.append(row)
    kinds = ("row", "padded", "compacted")
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for k in kinds:
            runs[k].append(simulate(lm, k, prompts, feeds, kept, args.compact_every))

    def median(k: str, field: str) -> float:
        return float(torch.tensor([r[field] for r in runs[k]]).median())

    ref = runs["row"][-1]["logits"]
    rows = []
    for k in kinds:
        diff = float((runs[k][-1]["logits"] - ref).abs().max())
        rows.append({"cache": k, "forward_ms": median(k, "forward_ms"), "bookkeeping_ms": median(k, "bookkeeping_ms"),
                     "total_ms": median(k, "total_ms"), "physical_length": runs[k][-1]["physical_length"],
                     "max_logit_diff_vs_row": diff})
    base = rows[0]["total_ms"]
    for r in rows:
        r["vs_row"] = r["total_ms"] / base
    meta = {"batch": args.batch, "prompt_len": args.prompt_len, "iterations": args.iterations, "gamma": args.gamma,
            "alpha": args.alpha, "compact_every": args.compact_every, "model": args.zoo or "random-init small shape",
            "committed_per_row": args.prompt_len + sum(sum(k) for k in kept) / args.batch}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    t = Table(title=f"per-row rollback at B = {args.batch}: {args.iterations} iterations of γ + 1 = {args.gamma + 1} "
                    f"tokens, α {args.alpha}, after a {args.prompt_len}-token prompt ({meta['model']})")
    for col in ("cache", "forward ms/iter", "bookkeeping ms/iter", "total ms/iter", "vs row", "physical length",
                "max |Δlogit| vs row"):
        t.add_column(col, justify="left" if col == "cache" else "right")
    for r in rows:
        t.add_row(r["cache"], f"{r['forward_ms']:.2f}", f"{r['bookkeeping_ms']:.3f}", f"{r['total_ms']:.2f}",
                  f"{r['vs_row']:.2f}x", str(r["physical_length"]), f"{r['max_logit_diff_vs_row']:.1e}")
    Console().print(t)
    print(f"committed positions per row at the end: {meta['committed_per_row']:.0f} (the row cache's lengths)")


if __name__ == "__main__":
    main()
