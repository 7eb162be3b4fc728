"""A suite's results on disk, under `<out>/<suite>/`:

    <scenario>/<cell key>/{run.json, steps.jsonl, *.png}   a finished cell, written like a bench run
    .failed/<cell key>.json                                  the error of a cell's last failed try
    .running/<cell key>.json                                 a cell in flight (the driver's pid)
    suite.json                                               the last run's executor, jobs, timings
    report.md, *.png                                         `drift suite report`

Only complete runs are written as cells, atomically (`results.write_run`), so a crash, a Ctrl-C
or a lost worker leaves every finished cell intact and the missing ones absent.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

from drift_cli.atomic import atomic_write_json
from drift_cli.results import RunJson, load_run, write_run
from drift_cli.suite.spec import Cell, Suite

STATES = ("done", "running", "failed", "missing")


def suite_dir(out: Path, suite: Suite) -> Path:
    return Path(out) / suite.name


def cell_dir(root: Path, key: str) -> Path | None:
    """The finished cell's run directory, or None."""
    for run_json in Path(root).glob(f"*/{key}/run.json"):
        return run_json.parent
    return None


def load_cell(root: Path, key: str) -> RunJson | None:
    d = cell_dir(root, key)
    return None if d is None else load_run(d)


def write_cell(root: Path, cell: Cell, suite: Suite, run: RunJson, steps: list[dict]) -> Path:
    """A finished cell, written exactly like a bench run; its run_id is its key."""
    run = dict(run)  # type: ignore[assignment]
    run["run_id"] = cell.key
    # the worker ran it without an output directory or a command line of its own: record the driver's
    run["config"] = {**run["config"], "out": str(root)}
    run["env"] = {**run["env"], "argv": sys.argv}
    run["cell"] = {"suite": suite.name, "key": cell.key, "coords": dict(cell.coords)}
    old = cell_dir(root, cell.key)   # a cell re-run by hand (its directory deleted meanwhile) is fine
    if old is not None:
        shutil.rmtree(old)
    path = write_run(root, run, steps)
    (root / ".failed" / f"{cell.key}.json").unlink(missing_ok=True)
    return path


def write_failure(root: Path, cell: Cell, error: str) -> None:
    atomic_write_json(root / ".failed" / f"{cell.key}.json", {"key": cell.key, "coords": dict(cell.coords), "error": error})


def failure(root: Path, key: str) -> str | None:
    p = root / ".failed" / f"{key}.json"
    try:
        return json.loads(p.read_text())["error"]
    except (OSError, ValueError, KeyError):
        return None


def mark_running(root: Path, key: str) -> None:
    atomic_write_json(root / ".running" / f"{key}.json", {"pid": os.getpid(), "host": socket.gethostname()})


def clear_running(root: Path, key: str) -> None:
    (root / ".running" / f"{key}.json").unlink(missing_ok=True)


def _running(root: Path, key: str) -> bool:
    """In flight: marked by a driver that is still alive (a dead driver's marks are stale)."""
    try:
        mark = json.loads((root / ".running" / f"{key}.json").read_text())
    except (OSError, ValueError):
        return False
    if mark.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(mark["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return False
    return True


def cell_state(root: Path, key: str) -> str:
    if cell_dir(root, key) is not None:
        return "done"
    if _running(root, key):
        return "running"
    if failure(root, key) is not None:
        return "failed"
    return "missing"


def status(root: Path, suite: Suite) -> dict[str, str]:
    """cell key -> one of STATES."""
    return {c.key: cell_state(root, c.key) for c in suite.cells}
