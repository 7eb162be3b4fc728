"""`drift bench`: every requested method on the same prompt stream, then metrics and results.

The orchestration only: models come from `drift_cli.models` / the zoo, streams from
`drift_cli.scenarios`, decoding from `drift_cli.engine.loop`, numbers from `drift_cli.metrics`,
files from `drift_cli.results`.
"""

from __future__ import annotations

import gc
import math
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from drift_cli import interrupt, metrics
from drift_cli.bench_config import CONTROL_SCENARIO, BenchConfig, check_preset  # noqa: F401 (re-exported)
from drift_cli.engine.gamma import GammaConfig, profile_costs
from drift_cli.engine.graphs import make_lm
from drift_cli.engine.tree import TreeConfig
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, StreamRun, run_stream
from drift_cli.errors import BadInput, MethodFailure, debugging
from drift_cli.engine.policy import MethodContext
from drift_cli.methods import METHODS, resolve_methods, settings_classes
from drift_cli.methods.base import draft_lm
from drift_cli.models import (ModelInfo, Pair, check_same_tokenizer, checkpoint_dir, load_model, load_pair, load_tokenizer,
                              parse_device, parse_dtype, resolve_checkpoint)
from drift_cli.results import SCHEMA_VERSION, RunJson, environment, new_run_id
from drift_cli.stream import Stream

Progress = Callable[..., None]      # (label, done, total[, tokens generated so far])


@dataclass
class Models:
    pair: Pair
    zoo_preset: str | None
    switched: torch.nn.Module | None = None       # the changed target of a target-change stream
    switched_info: ModelInfo | None = None
    warmup_ms: float = 0.0                        # the run's warm-up before the first method (`warm_up`)

    def options(self, cfg: BenchConfig) -> dict[str, Any]:
        """The method options: the preset's tuned defaults (data), then what the user gave."""
        from drift_cli.zoo.presets import method_defaults

        given = {k: v for k, v in cfg.options.items() if v is not None}
        return {**cfg.options, **method_defaults(self.zoo_preset), **given}

    def context(self, scenario: str, cfg: BenchConfig) -> MethodContext:
        pair = self.pair

        head = pair.draft_info.kind != "model"

        def resolve_offline(divergence: str, on_policy: bool = False) -> Path:
            if self.zoo_preset is None:
                raise BadInput("the offline method needs --offline-draft PATH when --draft/--target are given")
            if head:
                from drift_cli.zoo.presets import pretrained_preset
                from drift_cli.zoo.pretrained import ensure_pretrained_offline_head

                if on_policy:
                    raise BadInput("--offline-on-policy: an EAGLE head's offline heads train on the target's text")
                return ensure_pretrained_offline_head(pretrained_preset(self.zoo_preset), scenario, divergence)
            from drift_cli.zoo import ensure_offline_draft

            return ensure_offline_draft(self.zoo_preset, scenario, divergence, on_policy)

        def load_draft(path: Path) -> torch.nn.Module:
            device = pair.target.device if hasattr(pair.target, "device") else torch.device("cpu")
            dtype = next(pair.draft.parameters()).dtype
            if head:                                  # an offline head, bound to the same target
                from drift_cli.eagle.load import load_head

                return load_head(checkpoint_dir(path, "offline head"), pair.target, pair.draft_info.kind, device, dtype)
            p = checkpoint_dir(path, "offline draft")
            check_same_tokenizer(load_tokenizer(p, "offline draft"), pair.tokenizer)
            return load_model(p, device, dtype)

        return MethodContext(
            draft=pair.draft,
            draft_path=Path(pair.draft_info.path),
            draft_fingerprint=pair.draft_info.fingerprint,
            eos_id=pair.eos_id,
            vocab_size=pair.target.get_output_embeddings().weight.shape[0],
            configs=MethodContext.settings_from_options(self.options(cfg), settings_classes()),
            scenario=scenario,
            seed=cfg.seed,
            resolve_offline=resolve_offline,
            load_draft=load_draft,
        )


def check_context(models: Models, stream: Stream, cfg: BenchConfig) -> None:
    """Prompt + --max-new-tokens, and --gamma, within both models' positions (no silent overrun)."""
    positions = min(getattr(m.config, "max_position_embeddings", None) or math.inf
                    for m in (models.pair.draft, models.pair.target))
    longest = max(len(p.ids) for p in stream.prompts)
    if longest + stream.max_new_tokens > positions:
        raise BadInput(f"the longest prompt ({longest} tokens) plus --max-new-tokens {stream.max_new_tokens} "
                       f"exceeds the models' context of {positions} positions")
    if cfg.gamma > positions:
        raise BadInput(f"--gamma {cfg.gamma} exceeds the models' context of {positions} positions")
    if positions < math.inf:
        for settings in cfg.configs().values():     # bounds a setting takes from the context
            if hasattr(settings, "check_context"):
                settings.check_context(int(positions))
    if cfg.switch_after is not None and cfg.switch_after >= len(stream.prompts):
        raise BadInput(f"--switch-target-after {cfg.switch_after} leaves no prompt for the changed target "
                       f"(the stream has {len(stream.prompts)} prompts)")


def set_threads(cfg: BenchConfig) -> None:
    """Small models on a shared CPU decode fastest, and with the least noise, on one thread."""
    if torch.device(cfg.device_name).type == "cpu":
        torch.set_num_threads(cfg.threads or 1)


def load_models(cfg: BenchConfig, progress: Progress | None = None) -> Models:
    set_threads(cfg)
    if cfg.draft is not None:
        models = Models(load_pair(cfg.draft, cfg.target, cfg.device_name, cfg.dtype_name, cfg.draft_kind), None)
        target_path = cfg.target
    else:
        from drift_cli.zoo import ensure_zoo

        zoo = cfg.zoo_name()
        zp = ensure_zoo(zoo, progress=progress)
        draft, kind = zp.draft, "auto"
        if cfg.drafter == "eagle":
            from drift_cli.zoo.presets import pretrained_preset
            from drift_cli.zoo.pretrained import ensure_pretrained_head

            draft, kind = ensure_pretrained_head(pretrained_preset(zoo), progress), "eagle3"
        models, target_path = Models(load_pair(draft, zp.target, cfg.device_name, cfg.dtype_name, kind), zoo), zp.target
    change = cfg.target_change()
    if change is not None:
        from drift_cli.zoo.target_change import ensure_changed_target

        path, print_ = resolve_checkpoint(ensure_changed_target(target_path, change, progress), "changed target")
        check_same_tokenizer(load_tokenizer(path, "changed target"), models.pair.tokenizer)
        models.switched = load_model(path, parse_device(cfg.device_name), parse_dtype(cfg.dtype_name))
        models.switched_info = ModelInfo(str(path), print_, sum(p.numel() for p in models.switched.parameters()))
    return models


def resolve_scenario(cfg: BenchConfig, name: str | None = None):
    """The scenario object (cheap: reads its TOML), so that bad names fail before any model loads."""
    from drift_cli import scenarios

    if name is None and cfg.corpus is not None:
        return scenarios.corpus_scenario(cfg.corpus)
    return scenarios.load_scenario(name or cfg.scenario)


def load_stream(cfg: BenchConfig, tokenizer, scenario) -> Stream:
    from drift_cli import scenarios

    stream = scenarios.build_stream(scenario, cfg.split, tokenizer, max_prompts=cfg.max_prompts, shuffle=cfg.shuffle)
    if cfg.max_new_tokens is not None:
        stream.max_new_tokens = cfg.max_new_tokens
    if not stream.prompts:
        raise BadInput(f"scenario '{stream.scenario}' has no prompts in its {cfg.split} split")
    return stream


def decode_config(cfg: BenchConfig, stream: Stream, eos_id: int | None) -> DecodeConfig:
    return DecodeConfig(cfg.gamma, stream.max_new_tokens, cfg.temperature, cfg.top_p, eos_id, cfg.seed, cfg.batch_size,
                        gamma_policy=cfg.configs()[GammaConfig], tree=cfg.configs()[TreeConfig])


def warm_up(target: CausalLM, models: Models, stream: Stream, dcfg: DecodeConfig, gamma_max: int | None = None) -> float:
    """Everything that must not land in a timed region, before the first method; returns its ms.

    On the engine's static path (CUDA: `drift_cli.engine.graphs`) both caches are sized for the
    stream (longest prompt + --max-new-tokens + γ + 1) and the graphs captured: the target's
    verification widths 1..γ+1 and the draft's step (1, 2) at the run's batch size and at batch 1
    (the cost profile's). Then one short untimed pass through both models, so that allocator,
    library and kernel warm-up stays out of the stats (at the run's batch size: a batch's per-row
    caches warm up too)."""
    import time

    from drift_cli.engine import graphs
    from drift_cli.engine.loop import Decoder
    from drift_cli.engine.sampling import Sampler
    from drift_cli.methods.vanilla import Vanilla

    t0 = time.perf_counter()
    gamma = max(dcfg.gamma, gamma_max or 0)
    usable = max(len(p.ids) for p in stream.prompts) + dcfg.max_new_tokens + gamma + 1
    policy = Vanilla(models.pair.draft)
    for slots in sorted({1, dcfg.batch_size}):
        graphs.prepare_lm(target, slots, range(1, gamma + 2), usable)
        for lm in graphs.draft_lms(policy):
            graphs.prepare_lm(lm, slots, (1, 2), usable)
    short = DecodeConfig(dcfg.gamma, min(8, dcfg.max_new_tokens), 0.0, None, dcfg.eos_id, dcfg.seed, dcfg.batch_size)
    prompts = [(i, p.ids, None) for i, p in enumerate(stream.prompts[:dcfg.batch_size])]
    Decoder(target, policy, short, Sampler()).run(prompts, [])
    graphs.sync(target.device)
    return (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True)
class Entry:
    """One row of a run: its name in run.json and how its policy is built from the method context.
    optional: a BadInput from `build` skips the row (recorded with its reason) instead of failing."""

    name: str
    build: Callable[[MethodContext], Any]
    optional: bool = False
    gamma: tuple[int, GammaConfig] | None = None   # this row's --gamma and γ policy (default: the run's)


def method_entries(names: list[str], explicit: bool = True) -> list[Entry]:
    return [Entry(n, METHODS[n].build, optional=not explicit) for n in names]


def run_entries(entries: list[Entry], models: Models, stream: Stream, cfg: BenchConfig,
                progress: Progress | None = None) -> tuple[dict[str, StreamRun], dict[str, str], dict[str, MethodFailure]]:
    """The one run loop (bench, ablate, analyze, suites): each entry on the stream, in order, under
    the same timing conditions. Returns (runs, skipped: name -> reason, failed: name -> failure).

    A method that raises while it is built or runs costs only itself: its failure is recorded, with
    the traceback printed at once under `drift --debug`, and the later entries still run. A
    BadInput is the user's and propagates (from building an optional entry: it skips the entry).

    A Ctrl-C or SIGTERM stops here, between entries as inside one: the runs that finished (and
    the interrupted one, marked incomplete) come back, fewer than `entries`. With nothing
    finished at all the interrupt propagates: there is nothing to write."""
    check_context(models, stream, cfg)
    dcfg = decode_config(cfg, stream, models.pair.eos_id)
    check_tree_engine(dcfg, models.pair.target)
    target = make_lm(models.pair.target, "target")
    ctx = models.context(stream.scenario, cfg)
    switch = (cfg.switch_after, make_lm(models.switched, "target")) if models.switched is not None else None
    runs: dict[str, StreamRun] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, MethodFailure] = {}
    try:
        gamma_max = max([dcfg.gamma] + [e.gamma[0] for e in entries if e.gamma])
        models.warmup_ms = warm_up(target, models, stream, dcfg, gamma_max)
        dcfg = replace(dcfg, cost_profile=profile_costs(target, draft_lm(models.pair.draft),
                                                        stream.prompts[0].ids, gamma_max, nodes=dcfg.tree.nodes))
        for entry in entries:
            try:
                policy = entry.build(ctx)
            except BadInput as e:
                if not entry.optional:
                    raise
                skipped[entry.name] = str(e)
                continue
            except Exception as e:  # noqa: BLE001 - the method's own failure: recorded, the others go on
                failed[entry.name] = method_failed(entry.name, e)
                continue
            label = f"{stream.scenario}/{entry.name}"
            tick = (lambda done, total, tokens, label=label: progress(label, done, total, tokens)) if progress else None
            # the models, tokenizer and stream live for the whole run: moving them out of the
            # collector's generations keeps its periodic passes short (they land inside whatever
            # span is timing, a method's adjust or update included)
            gc.collect()
            gc.freeze()
            try:
                ecfg = replace(dcfg, gamma=entry.gamma[0], gamma_policy=entry.gamma[1]) if entry.gamma else dcfg
                runs[entry.name] = run_loaded(cfg, models, lambda: run_stream(target, policy, stream, ecfg,
                                                                              on_prompt=tick, switch=switch))
            except BadInput:        # the user's input (a --bank-in file read as the stream starts): exit 2
                raise
            except Exception as e:  # noqa: BLE001 - as above (a KeyboardInterrupt is no Exception)
                failed[entry.name] = method_failed(entry.name, e)
                continue
            finally:
                gc.unfreeze()   # collectable again (extensions that check for leaks at exit stay quiet)
            if not runs[entry.name].complete:
                break
            announce_finished(entry.name)
    except KeyboardInterrupt:
        if not runs:
            raise
    return runs, skipped, failed


def check_tree_engine(dcfg: DecodeConfig, target: torch.nn.Module) -> None:
    """Token trees verify through the eager engine's row cache (a tree mask, one gather of the
    accepted path); the static-cache and graph paths (CUDA's default) score chains only."""
    from drift_cli.engine.graphs import ENGINE_ENV, engine_mode

    if dcfg.tree.nodes and engine_mode(target.get_output_embeddings().weight.device) != "eager":
        raise BadInput(f"--tree-nodes runs on the eager engine; set {ENGINE_ENV}=eager (the CUDA graphs score chains only)")


def method_failed(name: str, e: Exception) -> MethodFailure:
    """Record a method's failure; under `drift --debug` print its traceback now (stderr)."""
    failure = MethodFailure.of(name, e)
    if debugging():
        print(f"method {name} failed:\n{failure.traceback}", file=sys.stderr, end="", flush=True)
    return failure


def run_loaded(cfg: BenchConfig, models: Models, run: Callable[[], StreamRun]) -> StreamRun:
    """run(), beside a neutral background load when --background-load asks for one (its CPU
    seconds into the run's report as `background_load`)."""
    if not cfg.background_load:
        return run()
    from drift_cli.engine.load import BackgroundLoad

    with BackgroundLoad(models.pair.draft) as load:
        out = run()
    out.report = {**out.report, "background_load": load.report()}
    return out


def announce_finished(name: str) -> None:
    """With $DRIFT_FINISHED_METHODS_FILE set, append a line naming each method that finished its
    stream: an event a scheduler (or a test) can wait for instead of guessing from wall time."""
    path = os.environ.get("DRIFT_FINISHED_METHODS_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(name + "\n")


def run_methods(
    names: list[str], models: Models, stream: Stream, cfg: BenchConfig, progress: Progress | None = None,
    explicit: bool = True,
) -> tuple[dict[str, StreamRun], dict[str, str], dict[str, MethodFailure]]:
    """Registered methods by name through `run_entries`; explicit=False skips methods that cannot build."""
    return run_entries(method_entries(names, explicit), models, stream, cfg, progress)


def summarise(runs: dict[str, StreamRun], cfg: BenchConfig, target: torch.nn.Module | None = None,
              failed: dict[str, MethodFailure] | None = None) -> dict[str, dict]:
    """Every run's metrics; for greedy runs with a target given, `ar_divergence` too (see
    `drift_cli.engine.diverge`: where an output left ar's, and the target's top-2 gap there).
    A failed method's row is `{"error": {type, message}}` (`error_rows`)."""
    ar = runs.get("ar")
    greedy = cfg.temperature == 0.0

    def one(run: StreamRun) -> dict:
        gamma = max([cfg.gamma] + [s.gamma for s in run.steps])    # a row may have its own γ cap
        ratio = run.cost_profile.verify_ratio() if run.cost_profile else None
        return metrics.method_metrics(run, gamma, ar, greedy=greedy, verify_ratio=ratio,
                                      switch_prompt=cfg.switch_after)

    out = {name: {**one(run), "warmup_ms": run.warmup_ms, "report": run.report} for name, run in runs.items()}
    if greedy and ar is not None and target is not None:
        from drift_cli.engine.diverge import divergences

        for name, run in runs.items():
            if name != "ar" and out[name].get("ar_match_rate") not in (None, 1.0):
                out[name]["ar_divergence"] = divergences(target, run.generations, ar.generations)
    return out | error_rows(failed or {})


def error_rows(failed: dict[str, MethodFailure]) -> dict[str, dict]:
    """run.json rows of the methods that raised: the error and nothing else."""
    return {name: {"error": f.to_json()} for name, f in failed.items()}


def comparisons(methods: dict[str, dict], control: dict[str, dict] | None) -> dict[str, Any]:
    get = lambda m, k: methods.get(m, {}).get(k)  # noqa: E731

    def gap(metric: str, ci: str) -> float | None:      # n/a unless offline - vanilla exceeds its own CI
        noise = metrics.difference_half_width(get("offline", ci), get("vanilla", ci))
        return metrics.gap_closed(get("drift", metric), get("vanilla", metric), get("offline", metric), noise)

    out = {
        "gap_closed_alpha": gap("acceptance_rate", "acceptance_ci95"),
        "gap_closed_speedup": gap("speedup", "speedup_ci95"),
        "shift_penalty": None,
    }
    if control:
        out["shift_penalty"] = metrics.shift_penalty(control.get("vanilla", {}).get("speedup"), get("vanilla", "speedup"))
        out["control_acceptance_rate"] = control.get("vanilla", {}).get("acceptance_rate")
    return out


def step_records(runs: dict[str, StreamRun], scope: str = "main") -> list[dict]:
    """steps.jsonl rows: one per verification step, tagged with the stream scope and the method."""
    return [{"scope": scope, "method": m, **s.to_json()} for m, r in runs.items() for s in r.steps]


def envelope(cfg: BenchConfig, label: str, models: Models, stream: Stream, runs: dict[str, StreamRun],
             methods: dict[str, dict], **config: Any) -> RunJson:
    """The one results envelope (run.json) every run-producing command fills; commands add their own
    blocks (control and comparisons, ablation, analysis) to it. config: extra config fields."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": new_run_id(label),
        "scenario": stream.scenario,
        "split": cfg.split,
        "complete": all(r.complete for r in runs.values()) and not any("error" in m for m in methods.values()),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()} | {
            "max_new_tokens": stream.max_new_tokens, "prompts": len(stream.prompts), "zoo": models.zoo_preset,
            "dtype_resolved": cfg.dtype_name,
            "preset_method_defaults": {k: v for k, v in models.options(cfg).items()
                                       if cfg.options.get(k) is None and v is not None},
            **config},
        "env": environment(),
        "models": {"draft": models.pair.draft_info.to_json(), "target": models.pair.target_info.to_json(),
                   **({"target_after_switch": models.switched_info.to_json()} if models.switched_info else {})},
        "seeds": {"decode": cfg.seed},
        "stream": {"identity": stream.identity(), "prompts": len(stream.prompts), **stream.meta,
                   **methods.get("ar", {}).get("stream", {})},
        "cost_profile": next((r.cost_profile.to_json() for r in runs.values() if r.cost_profile), None),
        "warmup_ms": models.warmup_ms,
        "methods": methods,
    }


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> tuple[RunJson, list[dict]]:
    """Everything `drift bench` does except printing and writing."""
    cfg.validate()
    if cfg.batch_sizes:
        from dataclasses import replace

        cfg = replace(cfg, batch_size=cfg.batch_sizes[0])
    names = resolve_methods(cfg.methods)
    explicit = cfg.methods.strip() != "all"
    if "ar" not in names:
        names = ["ar"] + names   # every speedup is measured against ar on the same prompts
    else:
        names = ["ar"] + [n for n in names if n != "ar"]
    scenario = resolve_scenario(cfg)
    check_preset(cfg)
    models = load_models(cfg, progress)
    stream = load_stream(cfg, models.pair.tokenizer, scenario)
    runs, skipped, failed = run_methods(names, models, stream, cfg, progress, explicit)
    # From here on the main stream's runs are kept whatever signal comes: the summaries and the
    # envelope hold it (the run is then marked incomplete); the control and the batch curve are
    # runs of their own and stop as any run does. `complete` here: no signal stopped anything; a
    # method that failed costs only itself (the control and the batch curve still run), but the
    # run is marked incomplete at the end.
    with interrupt.held() as late:
        methods = summarise(runs, cfg, models.pair.target, failed)
    complete = (not late and all(r.complete for r in runs.values())
                and len(runs) + len(skipped) + len(failed) == len(names))

    control_runs: dict[str, StreamRun] = {}
    control = None
    if cfg.control and complete and cfg.corpus is None and stream.scenario != CONTROL_SCENARIO:
        try:
            cstream = load_stream(cfg, models.pair.tokenizer, resolve_scenario(cfg, CONTROL_SCENARIO))
            control_runs, _, control_failed = run_methods(["ar", "vanilla"], models, cstream, cfg, progress)
        except KeyboardInterrupt:   # nothing of the control finished; the main stream did
            control_runs, control_failed = {}, {}
        with interrupt.held() as late:
            control = summarise(control_runs, cfg, None, control_failed)
        failed = failed | {f"control/{name}": f for name, f in control_failed.items()}
        complete = not late and len(control_runs) + len(control_failed) == 2 and all(
            r.complete for r in control_runs.values())

    curve_steps: list[dict] = []
    curve = None
    if cfg.batch_sizes and complete:
        try:
            curve, curve_steps, complete = batch_curve(names, models, stream, cfg, methods, progress, explicit)
        except KeyboardInterrupt:
            curve, curve_steps, complete = None, [], False

    with interrupt.held() as late:
        run = envelope(cfg, "+".join(n for n in names if n != "ar") or "ar", models, stream, runs, methods,
                       methods_run=list(runs), methods_skipped=skipped)
        run["complete"] = complete and not late and not failed and not any(
            "error" in r for r in (curve or {}).get("rows", []))
        run["control"] = control or {}
        run["comparisons"] = comparisons(methods, control)
        if curve is not None:
            run["batch_curve"] = curve
        steps = step_records(runs) + step_records(control_runs, "control") + curve_steps
    return run, steps


CURVE_FIELDS = ("speedup", "speedup_ci95", "throughput_tokens_per_s", "throughput_speedup", "acceptance_rate",
                "mean_accepted_length", "overhead_pct", "harness_overhead_pct", "latency_ms_p50", "latency_ms_p99",
                "p50_step_ms", "ar_match_rate")


def batch_curve(names: list[str], models: Models, stream: Stream, cfg: BenchConfig, first: dict[str, dict],
                progress: Progress | None = None, explicit: bool = True) -> tuple[dict, list[dict], bool]:
    """--batch-sizes: every method (ar first) at each batch size on the same stream; the main run
    is the first size. Returns (the run.json block, its step records, complete: no signal stopped
    it). A method that failed at a size has a row with its `error` there."""
    from dataclasses import replace

    rows, steps, complete = [], [], True
    for i, size in enumerate(cfg.batch_sizes):
        if i == 0 and size == cfg.batch_size:
            methods = first
        else:
            at = replace(cfg, batch_size=size)
            runs, _, failed = run_methods(names, models, stream, at, progress, explicit)
            methods = summarise(runs, at, models.pair.target, failed)
            steps += step_records(runs, f"batch{size}")
            complete = complete and len(runs) + len(failed) == len(names) and all(r.complete for r in runs.values())
        rows += [{"batch_size": size, "method": name, **{k: m.get(k) for k in CURVE_FIELDS},
                  **({"error": m["error"]} if "error" in m else {})} for name, m in methods.items()]
        if not complete:
            break
    return {"sizes": list(cfg.batch_sizes), "rows": rows}, steps, complete
