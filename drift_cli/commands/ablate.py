"""`drift ablate --sweep AXIS`: one DRIFT knob swept on one prompt stream.

`ar` and `vanilla` run once (the speedup baseline and the no-memory reference); then `drift`
runs once per value of the axis with every other knob at its configured value. The run is
saved like a bench run (`results/<scenario>/<run-id>/run.json`, `steps.jsonl`, the bench plots)
plus `ablation-<axis>.png` (acceptance and speedup per value) and an `ablation` block in
run.json; `--json` prints run.json.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import click

from drift_cli import knobs
from drift_cli.commands.options import decode_options, drift_options, model_options
from drift_cli.console import ProgressCallback, emit, rich_progress, stdout_console
from drift_cli import interrupt
from drift_cli.errors import BadInput
from drift_cli.drift.config import DriftConfig, DriftFiles
from drift_cli.methods.drift import DriftMethod
from drift_cli.registry import unknown


@dataclass(frozen=True)
class Axis:
    option: str                       # the DriftConfig field (its knob parses and checks --values)
    values: tuple                     # the default sweep


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
}


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
        return ax, [knobs.parse_value(DriftConfig, ax.option, t) for t in texts]
    except BadInput as e:
        raise BadInput(f"--values for axis {axis}: {e}") from None


def label(axis: str, value) -> str:
    return f"drift[{axis}={value}]"


def run_ablation(cfg, axis: str, values: list, progress=None) -> tuple[dict, list[dict]]:
    """Everything `drift ablate` does except printing and writing. cfg: a BenchConfig.

    One run of the shared loop: ar and vanilla, then drift once per value (a value drift refuses
    to build with is skipped with its reason), all under the same timing conditions."""
    from dataclasses import replace

    from drift_cli import bench

    ax = AXES[axis]
    cfg.validate()
    scenario = bench.resolve_scenario(cfg)           # a bad name fails before any model loads
    models = bench.load_models(cfg, progress)
    stream = bench.load_stream(cfg, models.pair.tokenizer, scenario)

    def build_at(value):
        def build(ctx):
            ctx = replace(ctx, configs={**ctx.configs,
                                        DriftConfig: replace(ctx.config(DriftConfig), **{ax.option: value}),
                                        DriftFiles: replace(ctx.config(DriftFiles), bank_out=None)})
            return DriftMethod.build(ctx)
        return build

    entries = bench.method_entries(["ar", "vanilla"])
    entries += [bench.Entry(label(axis, v), build_at(v), optional=True) for v in values]
    runs, skipped = bench.run_entries(entries, models, stream, cfg, progress)
    methods = bench.summarise(runs, cfg)
    rows = [ablation_row(value, methods.get(label(axis, value)), skipped.get(label(axis, value))) for value in values]
    run = bench.envelope(cfg, f"ablate-{axis}", models, stream, runs, methods)
    run["ablation"] = {"axis": axis, "option": ax.option, "values": values, "rows": rows,
                       "vanilla_acceptance_rate": methods.get("vanilla", {}).get("acceptance_rate"),
                       "vanilla_speedup": methods.get("vanilla", {}).get("speedup"), "skipped": skipped}
    return run, bench.step_records(runs)


def ablation_row(value, m: dict | None, skipped: str | None) -> dict:
    if m is None:
        return {"value": value, "skipped": skipped or "not run"}
    report = m.get("report", {})
    return {"value": value, **{k: m.get(k) for k in ("acceptance_rate", "mean_accepted_length", "speedup",
                                                      "speedup_ci95", "overhead_pct", "convergence_steps")},
            "memory_bytes": report.get("memory_bytes"), "prototypes": report.get("prototypes")}


def plot_ablation(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab = run["ablation"]
    rows = [r for r in ab["rows"] if "skipped" not in r]
    xs = [str(r["value"]) for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(xs, [r["acceptance_rate"] for r in rows], marker="o", label="drift")
    if ab.get("vanilla_acceptance_rate") is not None:
        a1.axhline(ab["vanilla_acceptance_rate"], color="grey", ls="--", label="vanilla")
    a1.set_xlabel(ab["axis"])
    a1.set_ylabel("acceptance rate")
    a1.legend()
    a2.plot(xs, [r["speedup"] for r in rows], marker="o", label="drift")
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
    for col in ("value", "α", "τ", "speedup", "overhead %", "conv. steps", "prototypes", "memory MiB"):
        t.add_column(col, justify="right")
    for r in ab["rows"]:
        if "skipped" in r:
            t.add_row(str(r["value"]), f"skipped: {r['skipped']}", *[""] * 6)
            continue
        mem = r.get("memory_bytes")
        t.add_row(str(r["value"]), _f(r["acceptance_rate"]), _f(r["mean_accepted_length"], "{:.2f}"),
                  _f(r["speedup"], "{:.2f}"), _f(r["overhead_pct"], "{:.2f}"), _f(r["convergence_steps"], "{}"),
                  _f(r.get("prototypes"), "{}"), _f(None if mem is None else mem / 2**20, "{:.2f}"))
    return t


def _f(x, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def bench_config(scenario, corpus, methods: str, opts: dict):
    """A BenchConfig from a command's keyword options: BenchConfig's fields by name, the rest
    (DRIFT's flags) as method options. Validated."""
    from dataclasses import fields

    from drift_cli.bench import BenchConfig

    names = {f.name for f in fields(BenchConfig)}
    given = {k: v for k, v in opts.items() if k in names}
    method_opts = {k: v for k, v in opts.items() if k not in names}
    if scenario is None and corpus is None:
        scenario = "jargon"
    cfg = BenchConfig(scenario=scenario, corpus=corpus, methods=methods, control=False, options=method_opts, **given)
    cfg.validate()
    return cfg


@click.command()
@click.option("--sweep", "axis", required=True, help=f"the axis: {', '.join(AXES)}")
@click.option("--values", default=None, help="comma-separated values (default: the axis's preset sweep)")
@click.option("--scenario", default=None, help="scenario name (default jargon)")
@click.option("--corpus", default=None, help="ad-hoc shifted scenario from a text file, directory or JSONL")
@model_options
@decode_options
@drift_options
def ablate(axis, values, scenario, corpus, as_json, **opts) -> None:
    """Sweep one DRIFT knob on one stream (ar and vanilla run once as references)."""
    from drift_cli.results import check_writable, write_run

    _, parsed = sweep_values(axis, values)
    cfg = bench_config(scenario, corpus, "ar,vanilla", opts)
    check_writable(cfg.out)
    with rich_progress() as progress:
        run, steps = run_ablation(cfg, axis, parsed, ProgressCallback(progress))
    path = write_run(cfg.out, run, steps)
    plot_ablation(run, path / f"ablation-{axis}.png")
    if as_json:
        emit(run, True)
    else:

        console = stdout_console()
        console.print(f"→ {path}")
        console.print(ablation_table(run))
    if not run["complete"]:
        interrupt.exit_incomplete(path)
