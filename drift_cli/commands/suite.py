"""`drift suite run|status|report|export SUITE`: a declared grid of bench runs (see docs/suites.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from drift_cli.console import emit, err_console, stdout_console
from drift_cli.errors import BadInput

DEFAULT_OUT = Path("results/suites")
STATUS_ROWS = 1000     # above this many cells, the status table lists only the running and failed ones


def _suite_args(fn):
    opts = [
        click.argument("suite_file", metavar="SUITE", type=click.Path(path_type=Path)),
        click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
                     help="results root; the suite's cells live in OUT/<suite name>/"),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="fix a setting for every cell (e.g. --set zoo=micro); repeatable"),
        click.option("--quick", is_flag=True,
                     help="the suite's [quick] variant (CI-sized: its settings and points; results in <suite>-quick/)"),
        click.option("--json", "as_json", is_flag=True, help="print the result as JSON (and nothing else)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def suite_inputs(suite_file: Path, root: Path, suite) -> list[tuple[str, Path]]:
    """What a suite command reads: its suite file and each finished cell's run.json."""
    from drift_cli.suite import store

    done = store.finished_cells(root) if Path(root).is_dir() else {}
    return [("the suite file", suite_file)] + [(f"the run.json of cell {c.key}", done[c.key] / "run.json")
                                               for c in suite.cells if c.key in done]


def _load(suite_file: Path, overrides: tuple[str, ...], out: Path, quick: bool = False):
    from drift_cli.suite.spec import load_suite, parse_override
    from drift_cli.suite.store import suite_dir

    suite = load_suite(suite_file, dict(parse_override(o) for o in overrides), quick)
    return suite, suite_dir(out, suite)


@click.group()
def suite() -> None:
    """Declared experiment grids: run (locally or on Ray), status, report, export."""


class RunCommand(click.Command):
    """`suite run`: its --help ends with the settings a suite's tables and --set take."""

    def format_epilog(self, ctx, formatter) -> None:
        from drift_cli.commands.options import knob_help
        from drift_cli.suite.spec import setting_knobs

        with formatter.section("Settings (a suite's [base], [grid] and [axes] tables, or --set KEY=VALUE)"):
            formatter.write_dl([(name, knob_help(k, default)) for name, (k, default) in setting_knobs().items()])
        super().format_epilog(ctx, formatter)


@suite.command(cls=RunCommand)
@_suite_args
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", default=None, help="join this Ray cluster (default: start a local one for the run)")
@click.option("--jobs", type=int, default=None,
              help="cells at once (local; default 1), or the local Ray instance's CPUs (default: all cores)")
@click.option("--claim", "claim_ids", type=int, multiple=True,
              help="run only the cells this claim of the suite's [[claim]] tables reads (repeatable)")
@click.option("--only", "only", multiple=True, metavar="AXIS=LABEL[,LABEL...]",
              help="run only the cells at these points of an axis (repeatable; e.g. --only experiment=code,law)")
def run(suite_file, out, overrides, quick, as_json, executor, address, jobs, claim_ids, only) -> None:
    """Run every cell that is not done yet (a re-run resumes)."""
    from drift_cli.results import check_writable
    from drift_cli.suite.executors import run_suite

    if jobs is not None and jobs < 1:
        raise BadInput(f"--jobs must be at least 1 (got {jobs})")
    if address and executor != "ray":
        raise BadInput("--address joins a Ray cluster: give it with --executor ray")
    suite, root = _load(suite_file, overrides, out, quick)
    if claim_ids:
        from dataclasses import replace

        from drift_cli.suite.claims import claim_cells, load_claims

        spec = load_claims(suite)
        keys = {c.key for cid in claim_ids for c in claim_cells(suite, spec, cid)}
        suite = replace(suite, cells=tuple(c for c in suite.cells if c.key in keys))
    if only:
        from drift_cli.suite.spec import parse_only, select_cells

        suite = select_cells(suite, parse_only(only))
    check_writable(root)
    jobs = jobs or (1 if executor == "local" else os.cpu_count() or 1)

    def on_cell(cell, outcome, n, total):
        where = " ".join(f"{a}={v}" for a, v in cell.coords)
        if outcome[0] == "ok":
            err_console.print(f"[{n}/{total}] done {cell.key} {where} ({outcome[1]['wall_s']:.1f} s)", highlight=False)
        else:
            err_console.print(f"[{n}/{total}] FAILED {cell.key} {where}: {outcome[1]}", highlight=False, markup=False)

    from drift_cli.suite.store import finished_cells

    if executor == "ray":
        from drift_cli.suite.executors import ray_module

        ray_module()              # Ray missing: refused before the run starts
    done = len({c.key for c in suite.cells} & set(finished_cells(root)))
    err_console.print(f"suite {suite.name}: {len(suite.cells)} cells, {done} already done → {root}", highlight=False)
    summary = run_suite(suite, root, executor, jobs, address, on_cell)
    if as_json:
        emit(summary, True)
    else:
        stdout_console().print(
            f"suite {suite.name}: {summary['cells']} cells, {len(summary['executed'])} ran, "
            f"{summary['already_done']} already done, {len(summary['failed'])} failed "
            f"({summary['wall_s']:.1f} s) → {root}", highlight=False)
    if summary["failed"]:
        sys.exit(1)


@suite.command()
@_suite_args
def status(suite_file, out, overrides, quick, as_json) -> None:
    """Each cell's state: done, running, failed or missing."""
    from drift_cli.console import row_table
    from drift_cli.suite import store

    suite, root = _load(suite_file, overrides, out, quick)
    states = store.status(root, suite)
    if as_json:
        emit({"suite": suite.name, "dir": str(root), "cells": {
            c.key: {"state": states[c.key], "coords": dict(c.coords),
                    **({"error": store.failure(root, c.key)} if states[c.key] == "failed" else {})}
            for c in suite.cells}}, True)
        return
    counts = ", ".join(f"{sum(1 for s in states.values() if s == k)} {k}" for k in store.STATES)
    table = row_table(f"suite {suite.name}: {len(suite.cells)} cells ({counts})", ("cell", *suite.axes, "state"))
    listed = [c for c in suite.cells if len(suite.cells) <= STATUS_ROWS or states[c.key] in ("running", "failed")]
    for c in listed:
        err = store.failure(root, c.key) if states[c.key] == "failed" else None
        table.add_row(c.key, *[c.coord(a) or "" for a in suite.axes], states[c.key] + (f": {err}" if err else ""))
    stdout_console().print(table)
    if len(listed) < len(suite.cells):
        stdout_console().print(f"{len(suite.cells) - len(listed)} done or missing cells not listed (more than "
                               f"{STATUS_ROWS:,} cells); --json lists every cell", highlight=False)


@suite.command()
@_suite_args
@click.option("--claims", "claims", is_flag=True,
              help="write the claims report instead: each [[claim]] of the suite, its figure, CI and verdict")
@click.option("--claims-out", type=click.Path(path_type=Path), default=None,
              help="where --claims writes (default: the suite's [claims] out, or docs/claims-<suite>.md); PNGs "
                   "go beside it, and the claim record `drift claims index` reads into claims-records/<stem>.json")
@click.option("--only", "only", multiple=True, metavar="AXIS=LABEL[,LABEL...]",
              help="report only the cells at these points of an axis (repeatable; e.g. --only workload=code,law)")
@click.option("--claim", "claim_ids", type=int, multiple=True,
              help="with --claims: report only this claim (repeatable)")
def report(suite_file, out, overrides, quick, as_json, claims, claims_out, only, claim_ids) -> None:
    """One markdown report (report.md, acceptance.png, speedup.png) in the suite's directory;
    with --claims, the claims report (its [claims] out, its PNGs and its claim record)."""
    from drift_cli.suite.report import write_report

    suite, root = _load(suite_file, overrides, out, quick)
    if claims_out is not None and not claims:
        raise BadInput("--claims-out names where the claims report goes: give it with --claims")
    if claim_ids and not claims:
        raise BadInput("--claim picks claims of the claims report: give it with --claims")
    if only:
        from drift_cli.suite.spec import parse_only, select_cells

        suite = select_cells(suite, parse_only(only))
    if claims:
        from drift_cli.atomic import refuse_inputs
        from drift_cli.results import check_writable
        from drift_cli.suite.claims import load_claims, record_path, write_claims

        spec = load_claims(suite)            # a suite without claims fails before anything is read
        target = claims_out or spec.out
        check_writable(Path(target).parent)
        flag = "--claims-out" if claims_out else "[claims] out"
        refuse_inputs(target, suite_inputs(suite_file, root, suite), flag)
        refuse_inputs(record_path(target), suite_inputs(suite_file, root, suite), f"the claim record of {flag}")
        selection = "".join(f" --only {o}" for o in only) + "".join(f" --claim {c}" for c in claim_ids)
        path = write_claims(suite, root, target, quick, claim_ids, selection)
    else:
        if not root.is_dir():
            raise BadInput(f"no results for suite {suite.name} under {out} (run `drift suite run {suite_file}` first)")
        path = write_report(suite, root, root)
    if as_json:
        emit({"suite": suite.name, "report": str(path)}, True)
    else:
        click.echo(path.read_text())
        err_console.print(f"→ {path}", highlight=False)


@suite.command()
@_suite_args
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv", show_default=True,
              help="parquet needs pyarrow (pip install 'drift-bench[export]')")
@click.option("--file", "file", type=click.Path(path_type=Path), default=None,
              help="where to write (default: OUT/<suite name>/cells.csv or cells.parquet)")
def export(suite_file, out, overrides, quick, as_json, fmt, file) -> None:
    """The finished cells as one table: a row per cell and method, a column per setting and metric."""
    from drift_cli.atomic import check_output_target, refuse_inputs
    from drift_cli.export import suite_rows, write_rows
    from drift_cli.suite import store

    suite, root = _load(suite_file, overrides, out, quick)
    runs = store.finished_runs(root, suite)
    if not runs:
        raise BadInput(f"no finished cells of suite {suite.name} under {out} (run `drift suite run {suite_file}` first)")
    target = check_output_target(file or root / f"cells.{fmt}", "--file")
    refuse_inputs(target, suite_inputs(suite_file, root, suite), "--file")
    rows = suite_rows(({"suite": suite.name, "key": c.key, "coords": dict(c.coords)}, runs[c.key])
                      for c in suite.cells if c.key in runs)
    path = write_rows(rows, fmt, target)
    summary = {"suite": suite.name, "file": str(path), "rows": len(rows), "cells": len(runs),
               "not_done": len(suite.cells) - len(runs)}
    if as_json:
        emit(summary, True)
    else:
        err_console.print(f"{len(rows)} rows ({len(runs)} cells × their methods; {summary['not_done']} cells not done) "
                          f"→ {path}", highlight=False)
