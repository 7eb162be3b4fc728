"""The `drift` command line (Click + rich).

Exit codes: 0 ok, 1 a check failed (regress), 2 bad input. Bad input is one line on stderr,
never a traceback. With --json, stdout carries the JSON document and nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drift_cli.errors import BadInput, CheckFailed

err_console = Console(stderr=True)


def rich_progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True)


class ProgressCallback:
    """Adapts `(description, completed, total)` calls to rich progress tasks, one per description."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, description: str, completed: float, total: float) -> None:
        if description not in self.tasks:
            self.tasks[description] = self.progress.add_task(description, total=total)
        self.progress.update(self.tasks[description], completed=completed, total=total)


def emit(obj: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="drift-bench")
def cli() -> None:
    """drift-bench: speculative decoding under distribution shift."""


def _method_options(fn):
    from drift_cli.methods import METHODS

    seen: set[str] = set()
    for name in reversed(METHODS.names()):
        for opt in METHODS[name].cli_options:
            if opt.name not in seen:
                seen.add(opt.name)
                fn.__click_params__ = getattr(fn, "__click_params__", []) + [opt]
    return fn


def model_options(fn):
    opts = [
        click.option("--zoo", "zoo", default="small", show_default=True, help="built-in model zoo preset"),
        click.option("--draft", type=str, default=None, help="draft checkpoint (local Hugging Face dir)"),
        click.option("--target", type=str, default=None, help="target checkpoint (local Hugging Face dir)"),
        click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, or auto"),
        click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16, float16"),
        click.option("--threads", type=int, default=None, help="torch CPU threads (default 1 on the CPU)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def decode_options(fn):
    opts = [
        click.option("--split", default="test", show_default=True, help="dev or test"),
        click.option("--max-prompts", type=int, default=None, help="use the first N prompts of the stream"),
        click.option("--max-new-tokens", type=int, default=None, help="override the scenario's generation length"),
        click.option("--gamma", type=int, default=4, show_default=True, help="draft block size"),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy"),
        click.option("--top-p", type=float, default=None, help="nucleus sampling threshold"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", type=click.Path(path_type=Path), default=Path("results"), show_default=True),
        click.option("--json", "as_json", is_flag=True, help="print run.json to stdout (and nothing else)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


@cli.command()
@click.option("--scenario", default=None, help="scenario name (see `drift data list`); default jargon")
@click.option("--corpus", default=None, help="ad-hoc shifted scenario from a text file, directory or JSONL")
@click.option("--methods", default="all", show_default=True, help="'all' or a comma-separated list")
@click.option("--no-control", is_flag=True, help="skip the indist control stream")
@model_options
@decode_options
@_method_options
def bench(scenario, corpus, methods, no_control, zoo, draft, target, device, dtype, threads, split, max_prompts,
          max_new_tokens, gamma, temperature, top_p, seed, out, as_json, **method_opts) -> None:
    """Run methods on one prompt stream and compare them."""
    from drift_cli.bench import BenchConfig, run_bench
    from drift_cli.report import render_run
    from drift_cli.results import check_writable, write_run

    if scenario is None and corpus is None:
        scenario = "jargon"
    cfg = BenchConfig(scenario=scenario, corpus=corpus, methods=methods, zoo=zoo, draft=draft, target=target,
                      split=split, max_prompts=max_prompts, max_new_tokens=max_new_tokens, gamma=gamma,
                      temperature=temperature, top_p=top_p, seed=seed, device=device, dtype=dtype, threads=threads,
                      out=out, control=not no_control, options=method_opts)
    cfg.validate()
    check_writable(out)
    with rich_progress() as progress:
        run, steps = run_bench(cfg, ProgressCallback(progress))
    path = write_run(out, run, steps)
    if as_json:
        emit(run, True)
    else:
        render_run(run, stdout_console(), str(path))
    if not run["complete"]:
        sys.exit(130)


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the runs as a JSON list")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="re-render plots into this directory")
def report(run_dirs, as_json, out) -> None:
    """Re-render tables (and plots) from saved runs."""
    from drift_cli.plots import plot_run
    from drift_cli.report import render_run
    from drift_cli.results import check_writable, load_run

    runs = [load_run(d) for d in run_dirs]
    if out is not None:
        check_writable(out)
        for d, run in zip(run_dirs, runs, strict=True):
            target = Path(out) / Path(d).name
            target.mkdir(parents=True, exist_ok=True)
            plot_run(run, target)
    if as_json:
        emit(runs, True)  # type: ignore[arg-type]
        return
    console = stdout_console()
    for d, run in zip(run_dirs, runs, strict=True):
        render_run(run, console, str(d))


def _register_optional_commands() -> None:
    """Command groups that live in their own modules."""
    import importlib

    for module, attr in [("drift_cli.commands.data", "data"), ("drift_cli.commands.zoo", "zoo"),
                         ("drift_cli.commands.bank", "bank"), ("drift_cli.commands.ablate", "ablate"),
                         ("drift_cli.commands.analyze", "analyze"), ("drift_cli.commands.regress", "regress")]:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        cli.add_command(getattr(mod, attr))



def quiet_libraries() -> None:
    """Nothing is downloaded at run time, and library progress bars stay off our terminal."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def stdout_console() -> Console:
    """Rich console for results; wide enough for the tables when stdout is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps BadInput and usage errors to one line + exit 2."""
    quiet_libraries()
    try:
        rv = cli.main(args=argv, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except click.exceptions.UsageError as e:
        err_console.print(f"error: {e.format_message()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except (BadInput, CheckFailed) as e:
        err_console.print(f"error: {e}", highlight=False, soft_wrap=True, markup=False)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


# Last, so that command modules may import helpers defined above.
_register_optional_commands()
