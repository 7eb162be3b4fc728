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
from typing import Iterable

from drift_cli.atomic import atomic_write_json
from drift_cli.errors import BadInput
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


def mark_running(root: Path, keys: Iterable[str]) -> None:
    """Mark cells as handed to an executor by this driver. A mark is a hint for `status` (a dead
    driver's marks are stale), so it is renamed into place without an fsync: marking 20,000 cells
    takes a second, not minutes."""
    folder = Path(root) / ".running"
    mark = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for key in keys:
            tmp = folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(mark)
            os.replace(tmp, folder / f"{key}.json")
    except OSError as e:
        raise BadInput(f"cannot mark cells as running under {folder}: {e.strerror or e}") from None


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


def finished_cells(root: Path) -> dict[str, Path]:
    """cell key -> its run directory, for every finished cell under `root` (one directory scan)."""
    out: dict[str, Path] = {}
    for run_json in sorted(Path(root).glob("*/*/run.json")):
        if not run_json.parent.parent.name.startswith("."):
            out.setdefault(run_json.parent.name, run_json.parent)
    return out


def finished_runs(root: Path, suite: Suite) -> dict[str, RunJson]:
    """cell key -> run.json of the suite's finished cells, in suite order."""
    done = finished_cells(root)
    return {c.key: load_run(done[c.key]) for c in suite.cells if c.key in done}


def _marked(root: Path, folder: str) -> set[str]:
    """The cell keys with a mark in `root/folder/` (.running, .failed)."""
    try:
        return {f.name[:-len(".json")] for f in os.scandir(Path(root) / folder) if f.name.endswith(".json")}
    except OSError:
        return set()


def status(root: Path, suite: Suite) -> dict[str, str]:
    """cell key -> one of STATES: a scan of the suite's directory, then a read of the marks that exist."""
    done, running, failed = finished_cells(root), _marked(root, ".running"), _marked(root, ".failed")

    def state(key: str) -> str:
        if key in done:
            return "done"
        if key in running and _running(root, key):
            return "running"
        if key in failed and failure(root, key) is not None:
            return "failed"
        return "missing"

    return {c.key: state(c.key) for c in suite.cells}
