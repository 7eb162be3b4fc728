"""Terminal plumbing shared by every command: stderr console, progress bars, JSON output."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from drift_cli.atomic import strict_json

err_console = Console(stderr=True)


def rich_progress(transient: bool = True) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=err_console, transient=transient)


class ProgressCallback:
    """Adapts `(description, completed, total)` calls to rich progress tasks, one per description."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, description: str, completed: float, total: float) -> None:
        if description not in self.tasks:
            self.tasks[description] = self.progress.add_task(description, total=total)
        self.progress.update(self.tasks[description], completed=completed, total=total)


def row_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table of named rows: the first column (the name) left-aligned, the figures right-aligned."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    return table


def emit(obj: dict, as_json: bool) -> None:
    if as_json:
        click.echo(strict_json(obj, indent=2))


def quiet_libraries() -> None:
    """Nothing is downloaded at run time, and library progress bars stay off our terminal."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" not in sys.modules:    # read when transformers loads (a refusal never loads it)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def exit_unless_complete(run: dict, path) -> None:
    """After writing a run: one stderr line per method that raised, then exit 1; a run a signal
    stopped exits 128 + the signal (`interrupt.exit_incomplete`); a complete run returns."""
    from drift_cli import interrupt
    from drift_cli.errors import failure_line
    from drift_cli.results import method_errors

    errors = method_errors(run)
    for name, error in errors.items():
        err_console.print(f"error: {failure_line(name, error)} (what finished was written to {path})",
                          highlight=False, soft_wrap=True, markup=False)
    if errors and not interrupt.signalled():
        sys.exit(1)
    if not run["complete"]:
        interrupt.exit_incomplete(path)


def stdout_console() -> Console:
    """Rich console for results; wide enough for the tables when stdout is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=160)
