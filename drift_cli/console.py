"""Terminal plumbing shared by every command: stderr console, progress bars, JSON output."""

from __future__ import annotations

import math
import os
import sys
import time

from rich.console import Console
from rich.table import Table
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from drift_cli.atomic import strict_json
from drift_cli.errors import BadInput

err_console = Console(stderr=True)


def rich_progress(transient: bool = True) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=err_console, transient=transient)


PROGRESS_INTERVAL_S = 30.0      # without a TTY: one plain progress line this often (DRIFT_PROGRESS_INTERVAL)


def progress_interval() -> float | None:
    """Seconds between plain progress lines when stderr is not a terminal; None: off (0 or "off")."""
    text = os.environ.get("DRIFT_PROGRESS_INTERVAL", "").strip().lower()
    if not text:
        return PROGRESS_INTERVAL_S
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        return PROGRESS_INTERVAL_S
    return value if value > 0 and math.isfinite(value) else None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def progress_line(description: str, completed: float, total: float, tokens: int | None, elapsed: float) -> str:
    """`code/drift: 12/40 prompts, 153.2 tok/s, ETA 1m20s` (tok/s only when tokens are counted)."""
    unit = " prompts" if tokens is not None else ""
    parts = [f"{description}: {completed:g}/{total:g}{unit}"]
    if tokens is not None:
        parts.append(f"{tokens / elapsed:.1f} tok/s" if elapsed > 0 else "– tok/s")
    eta = elapsed / completed * (total - completed) if completed > 0 else None
    parts.append(f"ETA {_duration(eta)}" if eta is not None else "ETA –")
    return ", ".join(parts)


class ProgressCallback:
    """Adapts `(description, completed, total[, tokens])` calls to rich progress tasks, one per
    description. When stderr is not a terminal (a log file, CI, nohup), where rich draws nothing,
    it writes one plain line per task every `progress_interval()` seconds instead: the task (the
    method), prompts done out of the total, tokens/s and an ETA."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, int] = {}
        self.interval = None if err_console.is_terminal else progress_interval()
        self.started: dict[str, float] = {}
        self.last_line: dict[str, float] = {}

    def __call__(self, description: str, completed: float, total: float, tokens: int | None = None) -> None:
        if description not in self.tasks:
            self.tasks[description] = self.progress.add_task(description, total=total)
        self.progress.update(self.tasks[description], completed=completed, total=total)
        if self.interval is None:
            return
        now = time.monotonic()
        start = self.started.setdefault(description, now)
        if now - self.last_line.get(description, start) >= self.interval:
            self.last_line[description] = now
            print(progress_line(description, completed, total, tokens, now - start), file=sys.stderr, flush=True)


def row_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table of named rows: the first column (the name) left-aligned, the figures right-aligned."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    return table


def write_stdout(text: str) -> None:
    """`text` to stdout, flushed. A stdout that cannot take it (a full disk, /dev/full, a closed
    pipe) is one BadInput line (exit 2); stdout is then pointed at /dev/null so that the
    interpreter's own flush at exit adds no second message."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):   # a stdout with no file descriptor (captured)
            pass
        raise BadInput(f"cannot write to stdout: {e.strerror or e}") from None


def emit(obj: dict, as_json: bool) -> None:
    if as_json:
        write_stdout(strict_json(obj, indent=2) + "\n")


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
