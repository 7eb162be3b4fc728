"""`drift ablate --sweep AXIS`: one DRIFT knob, or the γ policy, swept on one prompt stream.

`ar` and `vanilla` run once (the speedup baseline and the no-memory reference); then `drift`
runs once per value of the axis with every other knob at its configured value. The
`gamma-policy` axis instead runs each of `--methods` (default vanilla,drift) once per γ policy
(`fixed`, `hf`, `ema`, `confidence`, `cost`; `NAME:K` sets that row's --gamma to K), after one
`ar`. The run is
saved like a bench run (`results/<scenario>/<run-id>/run.json`, `steps.jsonl`, the bench plots)
plus `ablation-<axis>.png` (acceptance and speedup per value) and an `ablation` block in
run.json; `--json` prints run.json.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import click

from drift_cli import knobs
from drift_cli.commands.options import NOT_IN_ABLATE, ablate_options, run_options
from drift_cli.console import ProgressCallback, emit, exit_unless_complete, rich_progress, stdout_console
from drift_cli.drift.config import DriftConfig, DriftFiles
from drift_cli.engine.gamma import GAMMA_POLICIES, GammaConfig
from drift_cli.errors import BadInput
from drift_cli.registry import unknown


@dataclass(frozen=True)
class Axis:
    option: str                       # the settings field (its knob parses and checks --values)
    values: tuple                     # the default sweep
    settings: type = DriftConfig      # the settings class the field belongs to


GAMMA_AXIS = "gamma-policy"


AXES: dict[str, Axis] = {
    "lambda": Axis("gain", (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5)),
    "eta": Axis("eta", (0.02, 0.05, 0.1, 0.2, 0.4)),
    "tau": Axis("tau", (0.8, 0.9, 0.95, 0.98, 0.99, 0.995)),
    "bank-size": Axis("bank_size", (256, 1024, 2048, 4096, 8192)),
    "support": Axis("support", (8, 16, 32, 64, 0)),
    "neighbors": Axis("neighbors", (1, 2, 4, 8)),
    "sigma": Axis("sigma", (0.1, 0.25, 0.5, 1.0)),
    "adaptive-rate": Axis("adaptive_rate", (True, False)),
    "key": Axis("key", ("draft", "target-est")),
    GAMMA_AXIS: Axis("policy", GAMMA_POLICIES, GammaConfig),
}


def parse_gamma_value(text: str) -> str:
    """'hf' or 'fixed:2' (a policy, optionally with its own --gamma), checked; returns it normalised."""
    name, _, k = text.strip().partition(":")
    knobs.parse_value(GammaConfig, "policy", name)
    if not k:
        return name.strip()
    if not k.strip().isdigit() or int(k) < 1:
        raise BadInput(f"--values {text!r}: the γ after ':' must be an integer >= 1")
    return f"{name.strip()}:{int(k)}"


def gamma_row(value: str, gamma: int, base: GammaConfig) -> tuple[int, GammaConfig]:
    """A gamma-policy value -> (that row's --gamma, its γ settings)."""
    name, _, k = value.partition(":")
    return (int(k) if k else gamma), replace(base, policy=name)


def sweep_values(axis: str, values: str | None) -> tuple[Axis, list]:
    """The axis and its values: --values parsed and checked by the axis's knob, as its flag is
    (BadInput on the first bad value), or the preset sweep."""
    if axis not in AXES:
        raise unknown("ablation axis", axis, AXES)
    ax = AXES[axis]
    if values is None:
        return ax, list(ax.values)
    texts = [t for t in values.split(",") if t.strip()]
    if not texts:
        raise BadInput("--values is empty")
    try:
        if axis == GAMMA_AXIS:
            return ax, [parse_gamma_value(t) for t in texts]
        return ax, [knobs.parse_value(ax.settings, ax.option, t) for t in texts]
    except BadInput as e:
        raise BadInput(f"--values for axis {axis}: {e}") from None


def label(axis: str, value, method: str = "drift") -> str:
    return f"{method}[{axis}={value}]"


def gamma_entries(cfg, methods: list[str], values: list[str]) -> list:
    """ar, then each method at each γ policy (a method that cannot build is skipped)."""
    from drift_cli import bench
    from drift_cli.methods import METHODS

    base = cfg.configs()[GammaConfig]
    entries = bench.method_entries(["ar"])
    for m in methods:
        entries += [bench.Entry(label(GAMMA_AXIS, v, m), METHODS[m].build, optional=True,
                                gamma=gamma_row(v, cfg.gamma, base)) for v in values]
    return entries


def run_ablation(cfg, axis: str, values: list, progress=None, methods: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Everything `drift ablate` does except printing and writing. cfg: a BenchConfig.

    One run of the shared loop: ar and vanilla, then drift once per value (a value drift refuses
    to build with is skipped with its reason), all under the same timing conditions. The
    gamma-policy axis: ar, then every method of `methods` at every value."""
    from drift_cli import bench
    from drift_cli.methods.drift import DriftMethod

    ax = AXES[axis]
    cfg.validate(policies(values) if axis == GAMMA_AXIS else None)
    scenario = bench.resolve_scenario(cfg)           # a bad name fails before any model loads
    models = bench.load_models(cfg, progress)
    stream = bench.load_stream(cfg, models.pair.tokenizer, scenario)
    if axis == GAMMA_AXIS:
        return run_gamma_ablation(cfg, values, methods or ["vanilla", "drift"], models, stream, progress)

    def build_at(value):
        def build(ctx):
            ctx = replace(ctx, configs={**ctx.configs,
                                        DriftConfig: replace(ctx.config(DriftConfig), **{ax.option: value}),
                                        DriftFiles: replace(ctx.config(DriftFiles), bank_out=None)})
            return DriftMethod.build(ctx)
        return build

    entries = bench.method_entries(["ar", "vanilla"])
    entries += [bench.Entry(label(axis, v), build_at(v), optional=True) for v in values]
    runs, skipped, failed = bench.run_entries(entries, models, stream, cfg, progress)
    methods = bench.summarise(runs, cfg, failed=failed)
    rows = [ablation_row(value, methods.get(label(axis, value)), skipped.get(label(axis, value))) for value in values]
    run = bench.envelope(cfg, f"ablate-{axis}", models, stream, runs, methods)
    run["ablation"] = {"axis": axis, "option": ax.option, "values": values, "rows": rows,
                       "vanilla_acceptance_rate": methods.get("vanilla", {}).get("acceptance_rate"),
                       "vanilla_speedup": methods.get("vanilla", {}).get("speedup"), "skipped": skipped}
    return run, bench.step_records(runs)


def run_gamma_ablation(cfg, values: list[str], methods: list[str], models, stream, progress=None):
    from drift_cli import bench

    runs, skipped, failed = bench.run_entries(gamma_entries(cfg, methods, values), models, stream, cfg, progress)
    summary = bench.summarise(runs, cfg, failed=failed)
    rows = [{"method": m, **ablation_row(v, summary.get(label(GAMMA_AXIS, v, m)), skipped.get(label(GAMMA_AXIS, v, m)))}
            for m in methods for v in values]
    run = bench.envelope(cfg, f"ablate-{GAMMA_AXIS}", models, stream, runs, summary)
    run["ablation"] = {"axis": GAMMA_AXIS, "option": "gamma_policy", "values": values, "methods": methods,
                       "rows": rows, "skipped": skipped}
    return run, bench.step_records(runs)


def ablation_row(value, m: dict | None, skipped: str | None) -> dict:
    if m is None:
        return {"value": value, "skipped": skipped or "not run"}
    if "error" in m:                                  # the method raised (bench.error_rows)
        return {"value": value, "error": m["error"]}
    report = m.get("report", {})
    return {"value": value, **{k: m.get(k) for k in ("acceptance_rate", "mean_accepted_length", "speedup",
                                                      "speedup_ci95", "overhead_pct", "convergence_steps")},
            "predicted_speedup_measured": m.get("predicted_speedup_measured"),
            "gamma_histogram": m.get("gamma_histogram"), "target_change": m.get("target_change"),
            "memory_bytes": report.get("memory_bytes"), "prototypes": report.get("prototypes")}


def plot_ablation(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab = run["ablation"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for method in ab.get("methods", ["drift"]):
        rows = [r for r in ab["rows"] if "skipped" not in r and "error" not in r
                and r.get("method", "drift") == method]
        xs = [str(r["value"]) for r in rows]
        a1.plot(xs, [r["acceptance_rate"] for r in rows], marker="o", label=method)
        a2.plot(xs, [r["speedup"] for r in rows], marker="o", label=method)
    if ab.get("vanilla_acceptance_rate") is not None:
        a1.axhline(ab["vanilla_acceptance_rate"], color="grey", ls="--", label="vanilla")
    a1.set_xlabel(ab["axis"])
    a1.set_ylabel("acceptance rate")
    a1.legend()
    if ab.get("vanilla_speedup") is not None:
        a2.axhline(ab["vanilla_speedup"], color="grey", ls="--", label="vanilla")
    a2.set_xlabel(ab["axis"])
    a2.set_ylabel("speedup vs ar")
    a2.legend()
    fig.suptitle(f"{run['scenario']} ({run['split']}): sweep of {ab['axis']}")
    fig.tight_layout()
    from drift_cli.plots import save_figure

    save_figure(fig, path)


def ablation_table(run: dict):
    from rich.table import Table

    ab = run["ablation"]
    t = Table(title=f"sweep of {ab['axis']} ({run['scenario']}, {run['split']}); vanilla α "
                    f"{_f(ab.get('vanilla_acceptance_rate'))}, speedup {_f(ab.get('vanilla_speedup'), '{:.2f}')}",
              title_justify="left")
    by_method = "methods" in ab
    switched = any(r.get("target_change") for r in ab["rows"])   # a target-change stream
    cols = (("method",) if by_method else ()) + ("value", "α", "τ", "speedup", "95% CI", "pred. (measured)",
                                                 "overhead %", "conv. steps") + \
        (("α drop", "recovery steps") if switched else ()) + ("prototypes", "memory MiB")
    for col in cols:
        t.add_column(col, justify="right")
    for r in ab["rows"]:
        head = [r["method"]] if by_method else []
        if "skipped" in r or "error" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']['type']}"
            t.add_row(*head, str(r["value"]), why, *[""] * (len(cols) - len(head) - 2))
            continue
        mem, ci, tc = r.get("memory_bytes"), r.get("speedup_ci95"), r.get("target_change") or {}
        t.add_row(*head, str(r["value"]), _f(r["acceptance_rate"]), _f(r["mean_accepted_length"], "{:.2f}"),
                  _f(r["speedup"], "{:.2f}"), "–" if not ci else f"{ci[0]:.2f}–{ci[1]:.2f}",
                  _f(r.get("predicted_speedup_measured"), "{:.2f}"), _f(r["overhead_pct"], "{:.2f}"),
                  _f(r["convergence_steps"], "{}"),
                  *((_f(tc.get("alpha_drop")), _f(tc.get("recovery_steps"), "{}")) if switched else ()),
                  _f(r.get("prototypes"), "{}"),
                  _f(None if mem is None else mem / 2**20, "{:.2f}"))
    return t


def _f(x, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def policies(values: list[str]) -> set[str]:
    """The γ controllers a gamma-policy sweep selects ('hf:2' -> 'hf')."""
    return {v.partition(":")[0] for v in values}


def bench_config(methods: str, opts: dict, policies: set[str] | None = None):
    """A BenchConfig from a command's keyword options (BenchConfig's by name, the rest method
    options), running `methods` without the control stream. Checked, as `drift bench` checks."""
    from drift_cli.bench_config import BenchConfig

    cfg = BenchConfig.from_options({**opts, "methods": methods, "control": False})
    cfg.check(policies)
    return cfg


@click.command()
@click.option("--sweep", "axis", required=True, help=f"the axis: {', '.join(AXES)}")
@click.option("--values", default=None, help="comma-separated values (default: the axis's preset sweep; "
              "gamma-policy: NAME or NAME:K for a row at --gamma K)")
@click.option("--methods", "sweep_methods", default="vanilla,drift", show_default=True,
              help="gamma-policy axis: the methods run at every γ policy")
@run_options(skip=NOT_IN_ABLATE)
@ablate_options
def ablate(axis, values, sweep_methods, as_json, **opts) -> None:
    """Sweep one DRIFT knob (ar and vanilla run once as references), or the γ policy of some methods."""
    from drift_cli.methods import resolve_methods
    from drift_cli.results import check_writable, write_run

    _, parsed = sweep_values(axis, values)
    methods = [m for m in resolve_methods(sweep_methods) if m != "ar"] if axis == GAMMA_AXIS else None
    if methods == []:
        raise BadInput("--methods names no drafting method to sweep the γ policy of")
    if axis != GAMMA_AXIS and opts.get(AXES[axis].option) is not None:
        flag = knobs.find(AXES[axis].settings, AXES[axis].option)[1].flag
        raise BadInput(f"{flag} is swept by --sweep {axis}: give its values with --values")
    if axis == GAMMA_AXIS:
        cfg = bench_config("ar," + ",".join(methods), opts, policies(parsed))
    else:
        cfg = bench_config("ar,vanilla,drift", opts)
    check_writable(cfg.out)
    with rich_progress() as progress:
        run, steps = run_ablation(cfg, axis, parsed, ProgressCallback(progress), methods)
    path = write_run(cfg.out, run, steps)
    plot_ablation(run, path / f"ablation-{axis}.png")
    if as_json:
        emit(run, True)
    else:

        console = stdout_console()
        console.print(f"→ {path}")
        console.print(ablation_table(run))
    exit_unless_complete(run, path)
