"""The `drift` command line (Click + rich).

Exit codes: 0 ok, 1 a check failed (regress) or a method raised, 2 bad input. Bad input is one
line on stderr, never a traceback; so is a method that raised (its row in run.json records the
error, the others' results are written). `drift --debug` prints that method's traceback too.
With --json, stdout carries the JSON document and nothing else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from drift_cli import interrupt
from drift_cli.commands.ablate import ablate
from drift_cli.commands.analyze import analyze
from drift_cli.commands.bank import bank
from drift_cli.commands.claims import claims
from drift_cli.commands.data import data
from drift_cli.commands.options import bench_options
from drift_cli.commands.profile import profile
from drift_cli.commands.regress import regress
from drift_cli.commands.suite import suite
from drift_cli.commands.zoo import zoo
from drift_cli.console import (ProgressCallback, emit, err_console, exit_unless_complete, quiet_libraries, rich_progress,
                                stdout_console, write_stdout)
from drift_cli.errors import BadInput, CheckFailed


def _debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:                      # the environment: suite workers in other processes inherit it
        os.environ["DRIFT_DEBUG"] = "1"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="drift-bench")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_debug,
              help="A method that raises prints its traceback too (or set DRIFT_DEBUG=1).")
def cli() -> None:
    """drift-bench: speculative decoding under distribution shift."""


@cli.command()
@bench_options
def bench(as_json, **opts) -> None:
    """Run methods on one prompt stream and compare them.

    \b
    The drafter is a draft model (a small causal LM of the target's
    tokenizer) or an EAGLE head: one decoder layer that drafts from the
    target's own hidden states (EAGLE-1: its final state; EAGLE-3: three
    of its layers fused, over a reduced draft vocabulary). The engine hands
    the head those states out of the target passes it runs anyway.
    \b
    Run a head by path, in the layout vLLM, SGLang and SpecForge write
    (config.json + model.safetensors):
      drift bench --draft HEAD_DIR --target TARGET --draft-kind auto
    or the smollm zoo's head: drift bench --zoo smollm --drafter eagle.
    vanilla, drift, offline and osd run on either drafter (docs/eagle.md).
    """
    from drift_cli.bench_config import BenchConfig
    from drift_cli.results import check_writable

    cfg = BenchConfig.from_options(opts)
    cfg.check()                     # every refusal that needs no model, before torch loads
    check_writable(cfg.out)
    from drift_cli.bench import run_bench
    from drift_cli.report import render_run
    from drift_cli.results import write_run

    with rich_progress() as progress:
        run, steps = run_bench(cfg, ProgressCallback(progress))
    path = write_run(cfg.out, run, steps)
    bank_error = run["methods"].get("drift", {}).get("report", {}).get("bank_out_error")
    if bank_error:
        raise BadInput(f"{bank_error} (the run itself was written to {path})")
    if as_json:
        emit(run, True)
    else:
        render_run(run, stdout_console(), str(path))
    exit_unless_complete(run, path)


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the runs as a JSON list")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="re-render plots into this directory")
@click.option("--format", "fmt", type=click.Choice(["table", "csv"]), default="table", show_default=True,
              help="csv: one row per run and method, every setting and metric a column, on stdout")
def report(run_dirs, as_json, out, fmt) -> None:
    """Re-render tables (and plots) from saved runs."""
    from drift_cli.plots import plot_run
    from drift_cli.report import render_run
    from drift_cli.results import check_writable, load_run

    if as_json and fmt != "table":
        raise BadInput("--json and --format csv each choose what stdout carries: give one")
    runs = [load_run(d) for d in run_dirs]
    if out is not None:
        check_writable(out)
        for d, run in zip(run_dirs, runs, strict=True):
            plot_run(run, check_writable(Path(out) / Path(d).name))
    if as_json:
        emit(runs, True)  # type: ignore[arg-type]
        return
    if fmt == "csv":
        from drift_cli.export import csv_text, run_rows

        write_stdout(csv_text([row for run in runs for row in run_rows(run)]))
        return
    console = stdout_console()
    for d, run in zip(run_dirs, runs, strict=True):
        render_run(run, console, str(d))


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps BadInput and usage errors to one line + exit 2; signals to 130/143."""
    interrupt.install()
    quiet_libraries()
    try:
        rv = cli.main(args=argv, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except click.exceptions.UsageError as e:
        err_console.print(f"error: {e.format_message()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.exceptions.Abort as e:   # Click's name for a KeyboardInterrupt (SIGINT or SIGTERM)
        if isinstance(e.__cause__, EOFError):   # ... and for an EOFError, which no signal raised
            raise e.__cause__ from None
        err_console.print("interrupted")
        sys.exit(interrupt.exit_code())
    except (BadInput, CheckFailed) as e:
        text = " ".join(str(e).splitlines())     # one line, whatever a message quoted
        err_console.print(f"error: {text}", highlight=False, soft_wrap=True, markup=False)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(interrupt.exit_code())
    try:
        write_stdout("")              # what a command left buffered: a stdout that cannot take it is one line
    except BadInput as e:
        err_console.print(f"error: {e}", highlight=False, soft_wrap=True, markup=False)
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


for _group in (data, zoo, bank, ablate, analyze, regress, suite, claims, profile):   # command groups in their own modules
    cli.add_command(_group)
