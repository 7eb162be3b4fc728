"""`drift analyze residuals`: is the draft's error under shift systematic and low rank?

Runs `vanilla` (the static draft) on a stream with its residual recorder on
(`drift_cli.residuals`: at every rejected position, r = log p - log q over the whole vocabulary,
stacked and decomposed, uncentred and centred); the report gives the share of energy (Σσ²)
captured by the top 16 directions and the effective rank. With `--with-drift`
(default) `drift` runs too, and acceptance is bucketed by the target's entropy for both
methods: where DRIFT helps and where not. Saved like a bench run, plus `residuals.png` and
`entropy.png`.
"""

from __future__ import annotations

from pathlib import Path

import click

from drift_cli.commands.options import NOT_IN_ANALYZE, drift_options, run_options
from drift_cli.console import ProgressCallback, emit, exit_unless_complete, rich_progress, stdout_console
from drift_cli.errors import BadInput


def run_analysis(cfg, limit: int, with_drift: bool, progress=None) -> tuple[dict, list[dict]]:
    from drift_cli import bench, metrics
    from drift_cli.methods.drift import DriftMethod
    from drift_cli.methods.vanilla import Vanilla
    from drift_cli.residuals import spectrum

    cfg.validate()
    scenario = bench.resolve_scenario(cfg)           # a bad name fails before any model loads
    models = bench.load_models(cfg, progress)
    stream = bench.load_stream(cfg, models.pair.tokenizer, scenario)
    probe = Vanilla(models.pair.draft, residuals=limit)
    entries = [bench.Entry("vanilla", lambda ctx: probe)]
    if with_drift:
        entries.append(bench.Entry("drift", DriftMethod.build))
    runs, _, failed = bench.run_entries(entries, models, stream, cfg, progress)
    run = bench.envelope(cfg, "analyze-residuals", models, stream, runs,
                         {name: metrics.method_metrics(r, cfg.gamma, None, greedy=cfg.temperature == 0.0)
                          for name, r in runs.items()} | bench.error_rows(failed), max_residuals=limit)
    run["analysis"] = {
        "spectrum": spectrum(probe.recorder.rows),
        "acceptance_by_entropy": {name: metrics.acceptance_by_entropy(r.steps) for name, r in runs.items()},
        "acceptance_rate": {name: metrics.acceptance_rate(r.steps) for name, r in runs.items()},
    }
    return run, bench.step_records(runs)


def _save(fig, path: Path) -> None:
    from drift_cli.plots import save_figure

    save_figure(fig, path)


def plot_analysis(run: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from drift_cli.residuals import TOP

    sp = run["analysis"]["spectrum"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("uncentred", "centred"):
        s = sp[name]["singular_values"]
        a1.semilogy(range(1, len(s) + 1), [x / s[0] for x in s], label=name)
        a2.plot(range(1, len(s) + 1), sp[name]["cumulative_energy"], label=name)
    a1.set_xlabel("direction")
    a1.set_ylabel("σ_i / σ_1")
    a2.axvline(TOP, color="grey", ls="--")
    a2.set_xlabel("top directions")
    a2.set_ylabel("share of residual energy")
    a2.set_ylim(0, 1)
    for a in (a1, a2):
        a.legend()
    fig.suptitle(f"{run['scenario']}: draft-target residuals at {sp['residuals']} rejected positions")
    fig.tight_layout()
    _save(fig, out_dir / "residuals.png")

    ent = run["analysis"]["acceptance_by_entropy"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(ent))
    for i, (name, buckets) in enumerate(ent.items()):
        xs = [j + i * width for j in range(len(buckets))]
        ax.bar(xs, [b["acceptance_rate"] or 0.0 for b in buckets], width=width, label=name)
    first = next(iter(ent.values()))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(first))],
                  [entropy_label(b) for b in first])
    ax.set_xlabel("target entropy (nats)")
    ax.set_ylabel("acceptance rate")
    ax.legend()
    fig.tight_layout()
    _save(fig, out_dir / "entropy.png")


def entropy_label(bucket: dict) -> str:
    """'0.5-1' for a bucket of acceptance_by_entropy; the open last bucket (entropy_hi null) is '3+'."""
    hi = bucket["entropy_hi"]
    return f"{bucket['entropy_lo']:g}+" if hi is None else f"{bucket['entropy_lo']:g}-{hi:g}"


def analysis_tables(run: dict):
    from rich.table import Table

    from drift_cli.residuals import TOP

    sp = run["analysis"]["spectrum"]
    t1 = Table(title=f"residual spectrum ({sp['residuals']} rejected positions, V={sp['vocab']})", title_justify="left")
    for col in ("", f"energy top {TOP}", "effective rank", f"isotropic top {TOP}"):
        t1.add_column(col, justify="right")
    for name in ("uncentred", "centred"):
        t1.add_row(name, f"{sp[name][f'energy_top{TOP}']:.3f}", f"{sp[name]['effective_rank']:.1f}",
                   f"{sp[f'isotropic_energy_top{TOP}']:.3f}")
    ent = run["analysis"]["acceptance_by_entropy"]
    t2 = Table(title="acceptance by target entropy (nats)", title_justify="left")
    t2.add_column("entropy", justify="right")
    for name in ent:
        t2.add_column(f"{name} α", justify="right")
        t2.add_column(f"{name} n", justify="right")
    first = next(iter(ent.values()))
    for j, b in enumerate(first):
        cells = []
        for buckets in ent.values():
            a = buckets[j]["acceptance_rate"]
            cells += ["–" if a is None else f"{a:.3f}", str(buckets[j]["drafted"])]
        t2.add_row(entropy_label(b), *cells)
    return t1, t2


@click.group()
def analyze() -> None:
    """Analyses of the draft's errors."""


@analyze.command()
@click.option("--max-residuals", type=int, default=4096, show_default=True, help="rejected positions kept")
@click.option("--with-drift/--no-drift", default=True, show_default=True, help="also run drift for the entropy table")
@run_options(skip=NOT_IN_ANALYZE)
@drift_options
def residuals(max_residuals, with_drift, as_json, **opts) -> None:
    """SVD spectrum of draft-target residuals at rejected positions; acceptance by target entropy."""
    from drift_cli.commands.ablate import bench_config
    from drift_cli.results import check_writable, write_run

    if max_residuals < 2:
        raise BadInput(f"--max-residuals must be at least 2 (got {max_residuals})")
    cfg = bench_config("vanilla,drift" if with_drift else "vanilla", opts)
    check_writable(cfg.out)
    with rich_progress() as progress:
        run, steps = run_analysis(cfg, max_residuals, with_drift, ProgressCallback(progress))
    path = write_run(cfg.out, run, steps, plots=False)
    plot_analysis(run, path)
    if as_json:
        emit(run, True)
    else:

        console = stdout_console()
        console.print(f"→ {path}")
        for t in analysis_tables(run):
            console.print(t)
    exit_unless_complete(run, path)
