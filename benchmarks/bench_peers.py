"""Peer engines side by side: the same target, the same prompts, one process per engine.

    python benchmarks/bench_peers.py [--zoo smollm] [--scenario jargon] [--max-prompts 8]
        [--max-new-tokens 64] [--gamma 3] [--threads 1] [--device cpu] [--engines all]
        [--k-max 8] [--json FILE]

Engines (`--engines`, comma-separated, default all):
  ar, vanilla, pld      the harness (drift_cli.engine), greedy; vanilla drafts with the zoo's draft
  hf-greedy             transformers `generate()`, greedy
  hf-assisted           `generate(assistant_model=<the same draft>, num_assistant_tokens=γ)`, a
                        constant schedule
  hf-lookup             `generate(prompt_lookup_num_tokens=γ)`
  llama-cpp             llama-cpp-python on the target's own GGUF (its own weights: Q4_1 for
                        smollm), when it is importable and the zoo's target is a GGUF; not a
                        dependency. A build that works on an AVX-512 CPU (GGML_NATIVE=ON, which
                        turns on AMX, segfaulted in its first decode on one):
                          CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_OPENMP=OFF" \\
                              pip install llama-cpp-python==0.3.36

Each engine is a process of its own (`--worker ENGINE`), started once; it loads the pair, warms up,
and then decodes the prompt the driver names. The driver takes the prompts in turn and, for each,
every engine one after the other, so a busy spell of a shared machine lands on all of them. Every
engine generates exactly --max-new-tokens tokens (EOS does not stop it). Reported per engine: tok/s
(tokens over the summed decode time, prefill included), ms per prompt, how many of its outputs equal
the harness `ar`'s, and its cost curve: ms for the target to score k tokens after a cached prefix,
k = 1..--k-max (the harness engines share one target path, as do the transformers ones, so the
curve is measured by the first engine of each family). Timings on a shared machine are noisy:
name the CPU and say so with any figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HARNESS = ("ar", "vanilla", "pld")
HF = ("hf-greedy", "hf-assisted", "hf-lookup")
ENGINES = HARNESS + HF + ("llama-cpp",)
CURVE_OWNER = {"ar": "ar", "vanilla": "ar", "pld": "ar", "hf-greedy": "hf-greedy", "hf-assisted": "hf-greedy",
               "hf-lookup": "hf-greedy", "llama-cpp": "llama-cpp"}
REPS = 5   # cost-curve reps, interleaved over k; the fastest of each k is kept (the first is a warm-up)


# ---- the engines (one per worker process) -----------------------------------------------------------

def load(args):
    """The pair and the prompt stream, as `drift bench` loads them (greedy, no EOS stop)."""
    from drift_cli import bench
    from drift_cli.bench_config import BenchConfig

    cfg = BenchConfig.from_options({"zoo": args.zoo, "scenario": args.scenario, "max_prompts": args.max_prompts,
                                    "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
                                    "threads": args.threads, "device": args.device, "control": False,
                                    "methods": "ar"})
    cfg.validate()
    scenario = bench.resolve_scenario(cfg)
    models = bench.load_models(cfg)
    stream = bench.load_stream(cfg, models.pair.tokenizer, scenario)
    return bench, cfg, models, stream


class Harness:
    def __init__(self, name: str, args) -> None:
        from dataclasses import replace

        from drift_cli.engine.lm import CausalLM
        from drift_cli.methods import METHODS

        self.bench, cfg, self.models, self.stream = load(args)
        self.target = CausalLM(self.models.pair.target, "target")
        self.policy = METHODS[name].build(self.models.context(self.stream.scenario, replace(cfg, methods=name)))
        self.dcfg = self.bench.decode_config(cfg, self.stream, None)      # eos None: every engine makes N tokens

    def prompt(self, i: int) -> list[int]:
        return list(self.stream.prompts[i].ids)

    def generate(self, i: int, n: int) -> list[int]:
        from dataclasses import replace

        from drift_cli.engine.loop import run_stream

        one = replace(self.stream, prompts=[self.stream.prompts[i]], max_new_tokens=n)
        run = run_stream(self.target, self.policy, one, replace(self.dcfg, max_new_tokens=n))
        return list(run.generations[0].output_ids)

    def cost_ms(self, k_max: int) -> list[float]:
        from drift_cli.engine.gamma import profile_costs

        return list(profile_costs(self.target, None, self.prompt(0), k_max - 1, reps=REPS).verify_ms)


class Transformers:
    def __init__(self, name: str, args) -> None:
        import torch

        self.torch = torch
        self.bench, cfg, self.models, self.stream = load(args)
        self.model = self.models.pair.target
        self.kwargs: dict = {"do_sample": False}
        if name == "hf-assisted":
            draft = self.models.pair.draft
            draft.generation_config.num_assistant_tokens = args.gamma
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            self.kwargs["assistant_model"] = draft
        elif name == "hf-lookup":
            self.kwargs["prompt_lookup_num_tokens"] = args.gamma

    def prompt(self, i: int) -> list[int]:
        return list(self.stream.prompts[i].ids)

    def generate(self, i: int, n: int) -> list[int]:
        ids = self.torch.tensor([self.prompt(i)], device=self.model.device)
        out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                  pad_token_id=self.model.config.eos_token_id or 0, **self.kwargs)
        return out[0, ids.shape[1]:].tolist()

    def cost_ms(self, k_max: int) -> list[float]:
        """ms for the model to score k tokens after a cached prefix (a DynamicCache cropped back)."""
        from transformers import DynamicCache

        from drift_cli.engine.lm import _cache_kwarg, _drop    # both changed within transformers 5.x

        torch = self.torch
        ids = torch.tensor([self.prompt(0)], device=self.model.device)
        cache = DynamicCache()
        kw = {_cache_kwarg(self.model): cache, "use_cache": True}
        self.model(input_ids=ids[:, :-1], **kw)
        base = cache.get_seq_length()
        feed = ids[:, -1:].repeat(1, k_max)

        def once(k: int) -> float:
            sync()
            t0 = time.perf_counter()
            self.model(input_ids=feed[:, :k], **kw)
            sync()
            ms = (time.perf_counter() - t0) * 1e3
            _drop(cache, cache.get_seq_length() - base)
            return ms

        def sync() -> None:
            if self.model.device.type == "cuda":
                torch.cuda.synchronize()

        times = [[once(k) for k in range(1, k_max + 1)] for _ in range(REPS + 1)][1:]
        return [min(col) for col in zip(*times, strict=True)]


class LlamaCpp:
    def __init__(self, name: str, args) -> None:
        from llama_cpp import Llama  # noqa: F401 - the optional engine: absent -> skipped by the driver

        from drift_cli.zoo.presets import pretrained_preset

        preset = pretrained_preset(args.zoo)
        if preset is None:
            raise LookupError(f"the {args.zoo} zoo's target is no GGUF file")
        from drift_cli.zoo.pretrained import target_file

        self.bench, cfg, self.models, self.stream = load(args)    # the same prompts, as token ids
        self.llm = Llama(model_path=str(target_file(preset)), n_ctx=4096, n_threads=args.threads or 1,
                         n_threads_batch=args.threads or 1, verbose=False)

    def prompt(self, i: int) -> list[int]:
        return list(self.stream.prompts[i].ids)

    def generate(self, i: int, n: int) -> list[int]:
        out: list[int] = []
        for tok in self.llm.generate(self.prompt(i), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if len(out) == n:
                break
        return out

    def cost_ms(self, k_max: int) -> list[float]:
        """ms to evaluate k tokens after the cached prefix; the KV cache is cut back after each."""
        llm, ids = self.llm, self.prompt(0)
        llm.reset()
        llm.eval(ids[:-1])
        base = llm.n_tokens

        def once(k: int) -> float:
            t0 = time.perf_counter()
            llm.eval([ids[-1]] * k)
            ms = (time.perf_counter() - t0) * 1e3
            llm._ctx.kv_cache_seq_rm(-1, base, -1)
            llm.n_tokens = base
            return ms

        times = [[once(k) for k in range(1, k_max + 1)] for _ in range(REPS + 1)][1:]
        return [min(col) for col in zip(*times, strict=True)]


def make_engine(name: str, args):
    if name in HARNESS:
        return Harness(name, args)
    if name in HF:
        return Transformers(name, args)
    return LlamaCpp(name, args)


def worker(args) -> None:
    """Serve the driver: one JSON request a line on stdin, one JSON reply a line on stdout."""
    from drift_cli.console import quiet_libraries

    quiet_libraries()
    reply = sys.stdout
    sys.stdout = sys.stderr                     # a library's print never corrupts the replies
    try:
        import torch

        engine = make_engine(args.worker, args)
        with torch.inference_mode():
            engine.generate(0, min(8, args.max_new_tokens))        # warm-up, untimed
    except Exception as e:  # noqa: BLE001 - the driver reports the engine as skipped, with the reason
        print(json.dumps({"skipped": f"{type(e).__name__}: {e}".splitlines()[0]}), file=reply, flush=True)
        return
    print(json.dumps({"ready": True, "prompts": len(engine.stream.prompts)}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if not serve(engine, req, args, reply):
                return
        except Exception as e:  # noqa: BLE001 - one request failed: the driver records it, the others go on
            print(json.dumps({"error": f"{type(e).__name__}: {e}".splitlines()[0]}), file=reply, flush=True)


def serve(engine, req: dict, args, reply) -> bool:
    """Answer one request; False for quit."""
    import torch

    with torch.inference_mode():
        if req["op"] == "generate":
            cuda = args.device.startswith("cuda")
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = engine.generate(req["prompt"], args.max_new_tokens)
            if cuda:
                torch.cuda.synchronize()
            print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "ids": out}), file=reply, flush=True)
        elif req["op"] == "cost":
            print(json.dumps({"cost_ms": engine.cost_ms(args.k_max)}), file=reply, flush=True)
        else:
            return False
    return True


# ---- the driver -------------------------------------------------------------------------------

def bad_input(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def start(name: str, args) -> subprocess.Popen:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--zoo", args.zoo, "--scenario",
            args.scenario, "--max-prompts", str(args.max_prompts), "--max-new-tokens", str(args.max_new_tokens),
            "--gamma", str(args.gamma), "--threads", str(args.threads), "--device", args.device, "--k-max", str(args.k_max)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def ask(proc: subprocess.Popen, req: dict) -> dict:
    proc.stdin.write(json.dumps(req) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("the engine's process ended")
    return json.loads(line)


def run(args) -> dict:
    names = list(ENGINES) if args.engines == "all" else [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        bad_input(f"unknown engine {unknown[0]!r}; choose from: {', '.join(ENGINES)}")
    procs, result = {}, {}
    for name in names:       # loaded one after another: the loads do not overlap the timed decodes
        proc = start(name, args)
        first = json.loads(proc.stdout.readline() or json.dumps({"skipped": "the process ended while loading"}))
        if "skipped" in first:
            proc.wait()
            result[name] = {"skipped": first["skipped"]}
            print(f"{name}: skipped ({first['skipped']})", file=sys.stderr)
            continue
        procs[name] = proc
        result[name] = {"ms": [], "ids": []}
        prompts = first["prompts"]
    try:
        for i in range(prompts if procs else 0):         # interleaved: prompt i on every engine in turn
            for name, proc in procs.items():
                if "error" in result[name]:
                    continue
                r = ask(proc, {"op": "generate", "prompt": i})
                if "error" in r:
                    result[name]["error"] = r["error"]
                    continue
                result[name]["ms"].append(r["ms"])
                result[name]["ids"].append(r["ids"])
        for name, proc in procs.items():
            if CURVE_OWNER[name] == name:
                r = ask(proc, {"op": "cost"})
                result[name]["cost_ms"], result[name]["cost_error"] = r.get("cost_ms"), r.get("error")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.close()
                proc.wait(timeout=60)
    return summarise(result, args)


def summarise(result: dict, args) -> dict:
    """tok/s, ms per prompt, outputs equal to ar's, and the cost curves, per engine."""
    engines = {}
    ar = result.get("ar", {}).get("ids")
    for name, r in result.items():
        if "skipped" in r or "error" in r:
            engines[name] = {"skipped": r.get("skipped") or f"failed: {r['error']}"}
            continue
        tokens, seconds = sum(len(x) for x in r["ids"]), sum(r["ms"]) / 1e3
        owner = CURVE_OWNER[name]
        engines[name] = {
            "tok_s": tokens / seconds if seconds else None, "tokens": tokens, "seconds": seconds, "prompts": len(r["ids"]),
            "ms_per_prompt_median": statistics.median(r["ms"]) if r["ms"] else None,
            "outputs_equal_to_ar": None if ar is None else sum(a == b for a, b in zip(r["ids"], ar, strict=True)),
            "cost_ms": result.get(owner, {}).get("cost_ms"), "cost_measured_by": owner,
            **({"cost_error": result[owner]["cost_error"]} if result.get(owner, {}).get("cost_error") else {}),
        }
    tok = {n: e.get("tok_s") for n, e in engines.items()}
    return {
        "benchmark": "peer engines, same target and prompts", "zoo": args.zoo, "scenario": args.scenario,
        "prompts": args.max_prompts, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
        "threads": args.threads, "device": args.device, "k_max": args.k_max,
        "machine": f"{platform.machine()} {os.cpu_count()} cores ({platform.processor() or 'cpu'})",
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engines": engines,
        "ar_over_hf_greedy": tok["ar"] / tok["hf-greedy"] if tok.get("ar") and tok.get("hf-greedy") else None,
    }


def table(doc: dict) -> str:
    k = doc["k_max"]
    head = ["engine", "tok/s", "ms/prompt", "= ar"] + [f"k={i}" for i in range(1, k + 1)]
    rows = []
    for name, e in doc["engines"].items():
        if "skipped" in e:
            rows.append([name, "skipped"] + [""] * (len(head) - 2))
            continue
        cost = e["cost_ms"] or [None] * k
        rows.append([name, f"{e['tok_s']:.1f}", f"{e['ms_per_prompt_median']:.0f}",
                     "–" if e["outputs_equal_to_ar"] is None else f"{e['outputs_equal_to_ar']}/{e['prompts']}"]
                    + ["–" if c is None else f"{c:.1f}" for c in cost])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    lines = [f"{doc['zoo']} / {doc['scenario']}: {doc['prompts']} prompts x {doc['max_new_tokens']} tokens, "
             f"γ {doc['gamma']}, {doc['threads']} thread(s), {doc['device']}; {doc['machine']}",
             "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("cost: ms for the target to score k tokens after a cached prefix (min of interleaved reps)")
    lines += [f"{name} skipped: {e['skipped']}" for name, e in doc["engines"].items() if "skipped" in e]
    if doc["ar_over_hf_greedy"] is not None:
        lines.append(f"harness ar / HF generate() greedy: {doc['ar_over_hf_greedy']:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", default="smollm")
    ap.add_argument("--scenario", default="jargon")
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engines", default="all", help=f"comma-separated: {', '.join(ENGINES)} (default all)")
    ap.add_argument("--k-max", type=int, default=8, help="the cost curve's largest k")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to FILE")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.max_prompts, args.max_new_tokens, args.gamma, args.threads, args.k_max) < 1:
        bad_input("--max-prompts, --max-new-tokens, --gamma, --threads and --k-max must be at least 1")
    if args.worker:
        worker(args)
        return
    doc = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))


if __name__ == "__main__":
    main()
