"""The GPU step, eager against static cache against CUDA graphs (docs/engine.md, "The GPU step").

    python benchmarks/bench_graphs.py --out DIR [--quick] [--device cuda]

Two parts, each written to DIR/graphs.json and summarised on stdout:

  1. equality: the committed micro pair (results/baselines/micro) decodes a synthetic stream with
     ar, vanilla and drift (reference backend) at batch 1 and 4 on each engine path; every
     output is compared with the eager path's and with ar's; a hooked target's features and
     logits are compared eager against graph.
  2. timing: `drift_cli.engine.graphs.time_forward` (batch 1, a 256-token cache, median of the
     reps) of random-init models of real shapes: the SmolLM2-135M target and its 2-layer draft,
     and Llama shapes of about 1B and 8B, eager and graph, at k = 1, 4 and 8 tokens scored.

On the CPU `--quick` runs every step at toy sizes (the graph path is then emulated). Nothing here
downloads anything: the shapes are configs and the weights random.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

SHAPES = {  # name: (hidden, intermediate, layers, heads, kv_heads, vocab, tie)
    "smollm-135m-target": (576, 1536, 30, 9, 3, 49152, True),
    "smollm-135m-draft-2l": (576, 1536, 2, 9, 3, 49152, True),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256, True),
    "llama-8b": (4096, 14336, 32, 32, 8, 128256, False),
}
TOY = {"toy-target": (64, 176, 3, 2, 2, 384, False), "toy-draft": (64, 176, 1, 2, 2, 384, False)}


def llama(shape, dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv, vocab, tie = shape
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tie, max_position_embeddings=8192)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def stream(vocab: int, prompts: int, max_new: int):
    from drift_cli.stream import Prompt, Stream

    g = torch.Generator().manual_seed(0)
    lengths = [5, 17, 40, 9, 23, 2, 31, 12][:prompts]
    ps = [Prompt(tuple(torch.randint(3, vocab, (n,), generator=g).tolist()), f"d{i}") for i, n in enumerate(lengths)]
    return Stream("synthetic", "test", ps, max_new)


def equality(device: str, quick: bool) -> dict:
    from transformers import AutoModelForCausalLM

    from drift_cli.engine.graphs import make_lm
    from drift_cli.engine.loop import DecodeConfig, run_stream
    from drift_cli.methods.ar import Autoregressive
    from drift_cli.methods.drift import DriftMethod
    from drift_cli.methods.vanilla import Vanilla

    micro = ROOT / "results" / "baselines" / "micro"
    out: dict = {"runs": []}
    for dtype in (torch.float32,) if quick else (torch.float32, torch.bfloat16):
        load = lambda p: AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype).to(device).eval()  # noqa: E731
        draft, target = load(micro / "draft"), load(micro / "target")
        s = stream(target.config.vocab_size, 4 if quick else 8, 12 if quick else 32)
        for b in (1, 4):
            cfg = DecodeConfig(gamma=3, max_new_tokens=s.max_new_tokens, batch_size=b)
            ref = None
            for mode in ("eager", "static", "graph"):
                os.environ["DRIFT_ENGINE"] = mode
                lm = make_lm(target, "target")
                outs = {}
                for name, policy in (("ar", Autoregressive()), ("vanilla", Vanilla(draft)),
                                     ("drift", DriftMethod(draft, backend="reference"))):
                    t0 = time.perf_counter()
                    run = run_stream(lm, policy, s, cfg)
                    wall = (time.perf_counter() - t0) * 1e3
                    outs[name] = [g.output_ids for g in run.generations]
                    steps = run.steps
                    out["runs"].append({
                        "dtype": str(dtype).removeprefix("torch."), "batch": b, "mode": mode, "method": name,
                        "equal_to_ar": outs[name] == outs["ar"],
                        "equal_to_eager": None if ref is None else outs[name] == ref[name],
                        "warmup_ms": round(run.warmup_ms, 2), "wall_ms": round(wall, 1),
                        "mean_step_ms": round(sum(x.total_ms for x in steps) / max(1, len(steps)) * b, 3),
                        "mean_forward_target_ms": round(sum(x.forward_target_ms for x in steps) / max(1, len(steps)) * b, 3),
                        "graph_replays": getattr(lm, "graph_replays", None),
                        "accepted": sum(x.accepted for x in steps), "drafted": sum(x.drafted for x in steps)})
                if ref is None:
                    ref = outs
        os.environ.pop("DRIFT_ENGINE", None)
        out.setdefault("features", []).append(features(target, device, dtype))
    return out


@torch.inference_mode()
def features(target, device: str, dtype) -> dict:
    """A hooked target (an EAGLE drafter's `capture`): features and logits, eager against graph."""
    from drift_cli.engine.graphs import make_lm

    ids = torch.randint(3, target.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1)).to(device)
    res = {}
    for mode in ("eager", "graph"):
        lm = make_lm(target, f"features-{mode}", mode)
        lm.capture((1, -1))
        lm.reset()
        if mode == "graph":
            lm.prepare((1, 2, 3, 4))
        lm.forward(ids[:, :20])
        _, logits = lm.forward(ids[:, 20:])
        res[mode] = (lm.features.float(), logits.float(), getattr(lm, "graph_replays", None))
        lm.capture(())
    e, g = res["eager"], res["graph"]
    return {"dtype": str(dtype).removeprefix("torch."), "graph_replays": g[2],
            "features_max_abs_diff": float((e[0] - g[0]).abs().max()), "logits_max_abs_diff": float((e[1] - g[1]).abs().max())}


def timing(device: str, quick: bool, reps: int) -> list[dict]:
    from drift_cli.engine.graphs import make_lm, time_forward

    rows = []
    shapes = TOY if quick else SHAPES
    for name, shape in shapes.items():
        for dtype in ((torch.float32,) if quick else
                      ((torch.float32, torch.bfloat16) if name.startswith("smollm") else (torch.bfloat16,))):
            try:
                model = llama(shape, dtype, device)
                row = {"model": name, "dtype": str(dtype).removeprefix("torch."),
                       "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
                for mode in ("eager", "graph"):
                    lm = make_lm(model, f"time-{mode}", mode)
                    for k in (1, 4, 8):
                        row[f"{mode}_k{k}_ms"] = round(time_forward(lm, k, reps=reps, context=32 if quick else 256), 4)
                rows.append(row)
                print(json.dumps(row), flush=True)
                del model, lm
                if device == "cuda":
                    torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - one shape failing keeps the others
                rows.append({"model": name, "dtype": str(dtype), "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-3000:]})
                print(rows[-1]["error"], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="toy sizes (the CPU check)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: equality, timing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    doc: dict = {"env": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
                         "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}}
    skip = set(args.skip.split(","))
    for part, fn in (("equality", lambda: equality(args.device, args.quick)),
                     ("timing", lambda: timing(args.device, args.quick, args.reps))):
        if part in skip:
            continue
        t0 = time.perf_counter()
        try:
            doc[part] = fn()
        except Exception as e:  # noqa: BLE001
            doc[part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            print(doc[part]["traceback"], flush=True)
        doc[f"{part}_s"] = round(time.perf_counter() - t0, 1)
        (args.out / "graphs.json").write_text(json.dumps(doc, indent=1))
    eq = doc.get("equality", {})
    for r in eq.get("runs", []) if isinstance(eq, dict) else []:
        print(f"{r['dtype']:9} B{r['batch']} {r['mode']:6} {r['method']:7} =ar {r['equal_to_ar']!s:5} "
              f"=eager {r['equal_to_eager']!s:5} step {r['mean_step_ms']:8.3f} ms  fwd_t {r['mean_forward_target_ms']:8.3f} "
              f"warmup {r['warmup_ms']:8.1f} replays {r['graph_replays']}")
    for f in eq.get("features", []) if isinstance(eq, dict) else []:
        print("features", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
