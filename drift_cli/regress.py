"""The acceptance regression gate: pin a draft/target pair's acceptance, re-measure it later.

A draft is tuned against one target checkpoint. When the target changes, acceptance can fall
while every output stays correct, so nothing else notices. `pin` measures acceptance on a fixed
regression stream and writes a versioned baseline; `check` rebuilds the same stream, measures
again and fails (exit 1) when acceptance fell by more than the tolerance.

Measurement reuses `drift_cli.bench` (one runner) and `drift_cli.metrics` (one formula).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable


from drift_cli.bench_config import BenchConfig, check_preset
from drift_cli.errors import BadInput, CheckFailed
from drift_cli.atomic import atomic_write_json
from drift_cli.results import environment
from drift_cli.stream import Stream
from drift_cli.zoo.cache import read_json

if TYPE_CHECKING:
    from drift_cli.bench import Models

BASELINE_KIND = "drift-regress-baseline"
BASELINE_VERSION = 1
DEFAULT_TOLERANCE = 0.02        # absolute acceptance (see docs/regress.md for the reasoning)
GATED_METHODS = ("vanilla", "drift")   # methods whose acceptance depends on the draft/target pair
DEFAULT_BASELINE_DIR = Path("results/baselines")
Progress = Callable[[str, float, float], None]


@dataclass
class RegressConfig:
    """What one measurement needs. The defaults are the regression stream: the indist dev split
    (all 20 prompts), 64 new tokens each: about 3300 drafted positions for vanilla on micro, and
    seconds of decoding there (docs/regress.md has the measured times)."""

    zoo: str | None = "micro"
    draft: str | None = None
    target: str | None = None
    methods: str = "vanilla"
    scenario: str | None = "indist"
    corpus: str | None = None
    split: str = "dev"
    max_prompts: int = 20
    max_new_tokens: int = 64
    gamma: int = 4
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"

    def method_names(self) -> list[str]:
        from drift_cli.methods import resolve_methods

        names = resolve_methods(self.methods)      # did-you-mean on unknown names, empty lists, repeats
        for n in names:
            if n not in GATED_METHODS:
                raise BadInput(f"method '{n}' cannot be gated: its acceptance does not depend on the "
                               f"draft/target pair; choose from {', '.join(GATED_METHODS)}")
        return names

    def bench_config(self) -> BenchConfig:
        cfg = BenchConfig(scenario=self.scenario, corpus=self.corpus, methods=self.methods,
                          zoo=self.zoo or "micro", draft=self.draft, target=self.target, split=self.split,
                          max_prompts=self.max_prompts, max_new_tokens=self.max_new_tokens, gamma=self.gamma,
                          temperature=self.temperature, seed=self.seed, device=self.device, dtype=self.dtype,
                          control=False)
        cfg.validate()
        if self.draft is None and self.zoo is None:
            raise BadInput("give --zoo PRESET or both --draft PATH and --target PATH")
        return cfg


# ---- identities --------------------------------------------------------------------------------

def tokenizer_identity(tokenizer) -> str:
    """sha256 of the token -> id map (sorted), the thing speculative decoding needs to agree on."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def stream_recipe(cfg: RegressConfig, stream: Stream) -> dict[str, Any]:
    """Everything needed to rebuild the regression stream (plus what it came out as)."""
    return {"scenario": cfg.scenario, "corpus": cfg.corpus, "name": stream.scenario, "split": cfg.split,
            "max_prompts": cfg.max_prompts, "prompts": len(stream.prompts),
            "max_new_tokens": stream.max_new_tokens, "identity": stream.identity(),
            "scenario_recipe_sha256": stream.meta.get("recipe_sha256"),
            "scenario_version": stream.meta.get("scenario_version")}


# ---- measuring ---------------------------------------------------------------------------------

def per_prompt_counts(run) -> tuple[list[int], list[int]]:
    """(accepted, drafted) per prompt, for the prompts that drafted anything."""
    pairs = [(sum(s.accepted for s in g.steps), sum(s.drafted for s in g.steps)) for g in run.generations]
    pairs = [(a, d) for a, d in pairs if d]
    return [a for a, _ in pairs], [d for _, d in pairs]


def method_acceptance(run) -> dict[str, Any]:
    """Pooled acceptance (the gated number, `metrics.acceptance_rate`) with a bootstrap 95% CI
    over prompts, and the per-prompt values."""
    from drift_cli import metrics

    accepted, drafted = per_prompt_counts(run)
    steps = run.steps
    return {
        "acceptance_rate": metrics.acceptance_rate(steps),
        "acceptance_ci95": list(metrics.bootstrap_ratio_ci(accepted, drafted)),
        "per_prompt_accepted": accepted,
        "per_prompt_drafted": drafted,
        "mean_accepted_length": metrics.mean_accepted_length(steps),
        "drafted_tokens": int(sum(drafted)),
        "accepted_tokens": int(sum(accepted)),
        "complete": run.complete,
    }


def load_pair(cfg: RegressConfig, progress: Progress | None = None) -> Models:
    from drift_cli import bench

    bcfg = cfg.bench_config()
    check_preset(bcfg)
    return bench.load_models(bcfg, progress)


def build_stream(cfg: RegressConfig, tokenizer) -> Stream:
    from drift_cli import bench

    bcfg = cfg.bench_config()
    return bench.load_stream(bcfg, tokenizer, bench.resolve_scenario(bcfg))


@contextlib.contextmanager
def measuring_threads():
    """Intra-op CPU threads while measuring: $DRIFT_REGRESS_THREADS, default 1. One thread keeps
    the float reduction order fixed (greedy ties cannot flip between runs) and, for small models
    on a shared machine, is much faster than two oversubscribed threads."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(measuring_thread_count())
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measuring_thread_count() -> int:
    text = os.environ.get("DRIFT_REGRESS_THREADS", "1")
    try:
        return max(1, int(text))
    except ValueError:
        raise BadInput(f"DRIFT_REGRESS_THREADS must be a positive integer (got {text!r})") from None


def measure(cfg: RegressConfig, models: Models, stream: Stream, progress: Progress | None = None) -> dict[str, dict]:
    from drift_cli import bench

    names = cfg.method_names()
    with measuring_threads():
        runs, _, failed = bench.run_methods(names, models, stream, cfg.bench_config(), progress)
    if failed:   # the gate needs every method measured: the first failure is the command's
        raise next(iter(failed.values())).exception
    missing = [n for n in names if n not in runs or not runs[n].complete]
    if missing:   # run_stream stops early only on Ctrl-C: pass it on, write nothing half-measured
        raise KeyboardInterrupt
    out = {n: method_acceptance(runs[n]) for n in names}
    for n, m in out.items():
        if m["acceptance_rate"] is None:
            raise BadInput(f"{n} drafted no tokens on the regression stream: raise --max-new-tokens")
    return out


def describe_models(models: Models) -> dict[str, Any]:
    """Each checkpoint's path, fingerprint and size, plus the zoo recipe it was built from (the
    hash in its recipe.json; None for a checkpoint not built by the zoo)."""
    out: dict[str, Any] = {"zoo": models.zoo_preset}
    for role, info in (("draft", models.pair.draft_info), ("target", models.pair.target_info)):
        recipe = read_json(Path(info.path) / "recipe.json")
        out[role] = info.to_json() | {"recipe": recipe.get("hash") if recipe else None}
    return out



def method_configs(names: list[str]) -> dict[str, Any]:
    """The method's own settings at their defaults (a changed default changes acceptance too)."""
    out: dict[str, Any] = {}
    if "drift" in names:
        from drift_cli.drift.config import DriftConfig

        out["drift"] = json.loads(DriftConfig.from_options({}).to_json())
    return out


# ---- pin ---------------------------------------------------------------------------------------

def default_baseline_path(cfg: RegressConfig) -> Path:
    pair = cfg.zoo if cfg.draft is None else Path(cfg.target).name
    return DEFAULT_BASELINE_DIR / f"{pair}.json"


def pin(cfg: RegressConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Measure the pair on the regression stream; returns the baseline document (not written)."""
    from drift_cli import bench

    names = cfg.method_names()
    bcfg = cfg.bench_config()
    bench.resolve_scenario(bcfg)                 # a bad scenario fails before any model loads
    models = load_pair(cfg, progress)
    stream = build_stream(cfg, models.pair.tokenizer)
    measured = measure(cfg, models, stream, progress)
    return {
        "kind": BASELINE_KIND,
        "baseline_version": BASELINE_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pair": describe_models(models),
        "tokenizer": {"identity": tokenizer_identity(models.pair.tokenizer)},
        "stream": stream_recipe(cfg, stream),
        "decode": {"gamma": cfg.gamma, "temperature": cfg.temperature, "seed": cfg.seed,
                   "device": cfg.device, "dtype": cfg.dtype, "cpu_threads": measuring_thread_count()},
        "method_config": method_configs(names),
        "methods": measured,
        "env": environment(),
    }


def write_baseline(path: Path, baseline: dict) -> Path:
    """Write the baseline; a checkpoint that lies beside it (pinned files, such as the committed
    micro pair in results/baselines/micro/) is recorded by a path relative to the baseline's
    directory, so the baseline and its files move together (a clone elsewhere, CI)."""
    path = Path(path)
    doc = json.loads(json.dumps(baseline))
    for role in ("draft", "target"):
        recorded = Path(doc["pair"][role]["path"]).resolve()
        if recorded.is_relative_to(path.parent.resolve()):
            doc["pair"][role]["path"] = str(recorded.relative_to(path.parent.resolve()))
    atomic_write_json(path, doc)
    return path


# ---- check -------------------------------------------------------------------------------------

REQUIRED = {"pair": dict, "tokenizer": dict, "stream": dict, "decode": dict, "methods": dict}


def load_baseline(path: Path) -> dict:
    """The baseline at `path`, or BadInput naming what is wrong with it."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"baseline {p} not found (create one with `drift regress pin --out {p}`)")
    try:
        doc = json.loads(p.read_text(), parse_constant=_refuse_non_finite)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"baseline {p} is not valid JSON ({e}); re-pin it with `drift regress pin`") from e
    except ValueError as e:   # NaN or Infinity: the gate could no longer fail
        raise BadInput(f"baseline {p} holds a non-finite figure ({e}); re-pin it with `drift regress pin`") from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind != BASELINE_KIND:
        raise BadInput(f"{p} is not a drift regress baseline (kind {kind!r}, expected {BASELINE_KIND!r})")
    if doc.get("baseline_version") != BASELINE_VERSION:
        raise BadInput(f"baseline {p} has version {doc.get('baseline_version')!r}; this drift-bench reads "
                       f"version {BASELINE_VERSION}: re-pin with `drift regress pin`")
    for key, typ in REQUIRED.items():
        if not isinstance(doc.get(key), typ):
            raise BadInput(f"baseline {p} is incomplete: field '{key}' is missing or malformed")
    if not doc["methods"] or any(not isinstance(m, dict) or not isinstance(m.get("acceptance_rate"), (int, float))
                                 for m in doc["methods"].values()):
        raise BadInput(f"baseline {p} is incomplete: no measured acceptance per method")
    for name, m in doc["methods"].items():
        if not 0 <= m["acceptance_rate"] <= 1:
            raise BadInput(f"baseline {p}: acceptance_rate of {name} is {m['acceptance_rate']}, not in [0, 1]")
    for role in ("draft", "target"):      # pinned files beside the baseline: relative to its directory
        entry = doc["pair"].get(role)
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and not Path(entry["path"]).is_absolute():
            entry["path"] = str((p.parent / entry["path"]).resolve())
    return doc


def _refuse_non_finite(constant: str):
    raise ValueError(f"{constant} is not a number JSON allows")


def config_from_baseline(doc: dict, zoo: str | None = None, draft: str | None = None, target: str | None = None,
                         device: str | None = None) -> RegressConfig:
    """The baseline's measurement settings; the pair from the flags, else the one it recorded."""
    s, d, pair = doc["stream"], doc["decode"], doc["pair"]
    if (draft is None) != (target is None):
        raise BadInput("give both --draft and --target, or neither")
    if draft is None and zoo is None:
        if pair.get("zoo"):
            zoo = pair["zoo"]
        else:
            draft, target = pair["draft"]["path"], pair["target"]["path"]
    try:
        return RegressConfig(zoo=zoo if draft is None else None, draft=draft, target=target,
                             methods=",".join(doc["methods"]), scenario=s.get("scenario"), corpus=s.get("corpus"),
                             split=s["split"], max_prompts=int(s["max_prompts"]),
                             max_new_tokens=int(s["max_new_tokens"]), gamma=int(d["gamma"]),
                             temperature=float(d["temperature"]), seed=int(d["seed"]),
                             device=device or d.get("device", "cpu"), dtype=d.get("dtype", "float32"))
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"baseline is incomplete: stream/decode field {e} is missing or malformed") from e


def check_tokenizer(doc: dict, tokenizer) -> None:
    """Refuse (exit 2) a pair whose tokenizer is not the pinned one: its acceptance is not comparable."""
    tok = tokenizer_identity(tokenizer)
    if tok != doc["tokenizer"].get("identity"):
        raise BadInput(f"the pair's tokenizer differs from the baseline's (vocab hash {tok[:12]} vs "
                       f"{str(doc['tokenizer'].get('identity'))[:12]}): acceptance is not comparable; re-pin")


def check_stream(doc: dict, stream: Stream) -> None:
    """Refuse (exit 2) when the rebuilt regression stream is not the pinned one."""
    ident = stream.identity()
    if ident != doc["stream"].get("identity"):
        s = doc["stream"]
        raise BadInput(f"the regression stream differs from the baseline's ({s.get('name')}/{s.get('split')}, "
                       f"{s.get('prompts')} prompts x {s.get('max_new_tokens')} tokens: identity {ident[:12]} vs "
                       f"{str(s.get('identity'))[:12]}); the scenario data or recipe changed; re-pin")


@dataclass
class Verdict:
    method: str
    old: float
    new: float
    old_ci: list[float]
    new_ci: list[float]

    @property
    def drop(self) -> float:
        return self.old - self.new

    def failed(self, tolerance: float) -> bool:
        return self.drop > tolerance + 1e-12    # equal to the tolerance passes; float noise does not fail


def compare(doc: dict, measured: dict[str, dict]) -> list[Verdict]:
    return [Verdict(name, float(old["acceptance_rate"]), float(measured[name]["acceptance_rate"]),
                    list(old.get("acceptance_ci95") or [math.nan, math.nan]),
                    list(measured[name]["acceptance_ci95"]))
            for name, old in doc["methods"].items()]


def fingerprint_changes(doc: dict, now: dict) -> dict[str, tuple[str, str]]:
    """role -> (old, new) for each checkpoint whose fingerprint differs from the baseline's."""
    out = {}
    for role in ("draft", "target"):
        old, new = doc["pair"][role].get("fingerprint"), now[role]["fingerprint"]
        if old != new:
            out[role] = (old, new)
    return out


def rebuilt_roles(doc: dict, now: dict) -> list[str]:
    """The checkpoints whose files differ but that were built from the pinned zoo recipe: a
    rebuild (on another CPU the same recipe gives other weights), not a checkpoint change."""
    changed = fingerprint_changes(doc, now)
    return [role for role in changed
            if now[role].get("recipe") and now[role].get("recipe") == doc["pair"][role].get("recipe")]


def pair_change(doc: dict, now: dict, machine_now: dict) -> str:
    """What differs from the pinned pair: "none", "hardware" (the same files on another machine),
    "rebuild" (the pinned recipe rebuilt with other weights) or "checkpoint" (other files)."""
    changed, rebuilt = fingerprint_changes(doc, now), rebuilt_roles(doc, now)
    if set(changed) - set(rebuilt):
        return "checkpoint"
    if rebuilt:
        return "rebuild"
    return "hardware" if machine_differences(doc, machine_now) else "none"


def machine_differences(doc: dict, machine_now: dict) -> list[str]:
    from drift_cli import machine

    return machine.differences((doc.get("env") or {}).get("machine"), machine_now)


def _fp(x: str | None) -> str:
    return (x or "?")[:12]


def pair_name(now: dict) -> str:
    label = f"zoo '{now['zoo']}' pair" if now.get("zoo") else "pair"
    return f"{label} (draft {now['draft']['path']}, target {now['target']['path']})"


def fingerprint_sentence(doc: dict, now: dict, machine_now: dict) -> str:
    """What the check compared: the same files (here or on other hardware), a rebuild of the
    pinned recipe, or a changed checkpoint."""
    changed, rebuilt = fingerprint_changes(doc, now), rebuilt_roles(doc, now)
    hardware = machine_differences(doc, machine_now)
    on_hardware = f" on other hardware ({'; '.join(hardware)})" if hardware else ""
    if not changed:
        if hardware:
            return (f"The same checkpoint files (draft {_fp(now['draft']['fingerprint'])}, target "
                    f"{_fp(now['target']['fingerprint'])}){on_hardware}: acceptance compared within the tolerance.")
        return (f"Checkpoints unchanged: draft {_fp(now['draft']['fingerprint'])}, "
                f"target {_fp(now['target']['fingerprint'])} match the baseline.")
    sentences = []
    if rebuilt:
        parts = [f"{role} rebuilt from recipe {_fp(now[role]['recipe'])}, weights differ "
                 f"({_fp(changed[role][0])} -> {_fp(changed[role][1])})" for role in rebuilt]
        sentences.append("Rebuilt from the pinned recipe" + on_hardware + ": " + "; ".join(parts)
                         + " (not a checkpoint change).")
    other = {r: c for r, c in changed.items() if r not in rebuilt}
    if other:
        parts = [f"{role} fingerprint changed {_fp(o)} -> {_fp(n)}" for role, (o, n) in other.items()]
        same = [r for r in ("draft", "target") if r not in changed]
        tail = f"; {same[0]} unchanged ({_fp(now[same[0]]['fingerprint'])})" if same else ""
        sentences.append("Checkpoint changed: " + "; ".join(parts) + tail + ".")
    return " ".join(sentences)


def _ci(ci: list[float]) -> str:
    return f"(95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci and not any(map(math.isnan, ci)) else ""


def _change(v: Verdict, tolerance: float) -> str:
    if v.failed(tolerance):
        return f"a drop of {v.drop:.3f}, more than the tolerance {tolerance:.3f}"
    if abs(v.drop) < 5e-4:
        return f"no change (tolerance {tolerance:.3f})"
    word = "a drop" if v.drop > 0 else "a rise"
    return f"{word} of {abs(v.drop):.3f}, within the tolerance {tolerance:.3f}"


def verdict_paragraph(doc: dict, now: dict, verdicts: list[Verdict], tolerance: float, machine_now: dict) -> str:
    """One paragraph: the pair, old and new fingerprints, old and new acceptance, the drop."""
    s, d = doc["stream"], doc["decode"]
    failed = [v for v in verdicts if v.failed(tolerance)]
    head = ("Acceptance regression" if failed else "Acceptance held") + f" for the {pair_name(now)}: "
    per_method = "; ".join(f"{v.method} acceptance {v.old:.3f} {_ci(v.old_ci)} -> {v.new:.3f} {_ci(v.new_ci)}, "
                           f"{_change(v, tolerance)}" for v in verdicts)
    where = (f"Measured on {s.get('name')}/{s.get('split')}, {s.get('prompts')} prompts x "
             f"{s.get('max_new_tokens')} new tokens (stream {_fp(s.get('identity'))}), gamma {d['gamma']}, "
             f"temperature {d['temperature']}, seed {d['seed']}.")
    advice = " " + regression_advice(doc, now) if failed else ""
    return f"{head}{per_method}. {fingerprint_sentence(doc, now, machine_now)} {where}{settings_note(doc)}{advice}"


def regression_advice(doc: dict, now: dict) -> str:
    """What the drop most likely means, from which fingerprints changed."""
    changed = {r: c for r, c in fingerprint_changes(doc, now).items() if r not in rebuilt_roles(doc, now)}
    repin = "or re-pin with `drift regress pin` if the lower acceptance is accepted."
    if rebuilt_roles(doc, now) and not changed:
        return ("The pair was rebuilt from the pinned recipe and its weights differ (another CPU's kernels round "
                "differently): pin the files, not the recipe, and check the pinned files by path (docs/regress.md), "
                f"{repin}")
    if "target" in changed:
        return f"The draft was tuned against the baseline's target: re-distil or re-tune it for the new target, {repin}"
    if "draft" in changed:
        return f"The new draft agrees less with this target than the pinned one did: keep the old draft, {repin}"
    return ("Both checkpoints are the pinned ones, so the drop comes from the code, the libraries or the platform "
            f"(compare the baseline's env with this report's): find the change, {repin}")


def settings_note(doc: dict) -> str:
    """A sentence when a gated method's default settings are no longer the pinned ones."""
    now = method_configs(list(doc["methods"]))
    old = doc.get("method_config") or {}
    moved = sorted(n for n in now if n in old and old[n] != now[n])
    return f" Note: {', '.join(moved)} default settings differ from the baseline's." if moved else ""


def check(doc: dict, cfg: RegressConfig, tolerance: float = DEFAULT_TOLERANCE,
          progress: Progress | None = None) -> dict[str, Any]:
    """Re-measure the baseline's stream; returns the check report (passed or not, never raises
    CheckFailed itself: `enforce` does)."""
    from drift_cli import bench

    if not 0 <= tolerance <= 1:
        raise BadInput(f"--tolerance must be in [0, 1] (an absolute drop in acceptance; got {tolerance})")
    bench.resolve_scenario(cfg.bench_config())
    models = load_pair(cfg, progress)
    check_tokenizer(doc, models.pair.tokenizer)   # first: a new tokenizer also changes the stream
    stream = build_stream(cfg, models.pair.tokenizer)
    check_stream(doc, stream)
    measured = measure(cfg, models, stream, progress)
    now = describe_models(models)
    env = environment()
    machine_now = env["machine"]
    verdicts = compare(doc, measured)
    passed = not any(v.failed(tolerance) for v in verdicts)
    change = pair_change(doc, now, machine_now)
    return {
        "kind": "drift-regress-check",
        "baseline_version": BASELINE_VERSION,
        "passed": passed,
        "tolerance": tolerance,
        "checkpoint_changed": change == "checkpoint",
        "pair_change": change,                  # none | hardware | rebuild | checkpoint
        "rebuilt": rebuilt_roles(doc, now),
        "machine_differences": machine_differences(doc, machine_now),
        "fingerprints": {role: {"baseline": doc["pair"][role].get("fingerprint"), "now": now[role]["fingerprint"]}
                         for role in ("draft", "target")},
        "pair": now,
        "baseline_pair": doc["pair"],
        "stream": doc["stream"],
        "decode": doc["decode"] | {"device": cfg.device},
        "methods": {v.method: {"baseline": v.old, "now": v.new, "drop": v.drop, "failed": v.failed(tolerance),
                               "baseline_ci95": v.old_ci, "now_ci95": v.new_ci,
                               "now_detail": measured[v.method]} for v in verdicts},
        "message": verdict_paragraph(doc, now, verdicts, tolerance, machine_now),
        "env": env,
    }


def enforce(report: dict) -> None:
    """Exit 1 (CheckFailed, the paragraph as its message) when the check failed."""
    if not report["passed"]:
        raise CheckFailed(report["message"])
