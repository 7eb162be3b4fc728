"""Running a suite's cells: in this process, in a local process pool, or as Ray tasks.

Every executor runs the same function on a cell (`execute_cell`: one `run_bench`) and hands
(run.json, steps) back to the driver, which alone writes results (`run_suite`). No file system is
assumed to be shared between the driver and the workers. Builds a cell needs (the zoo, the
scenario splits, offline drafts) are made once per machine before any cell starts (`prepare`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from drift_cli import interrupt
from drift_cli.atomic import atomic_write_json
from drift_cli.errors import BadInput, failure_line, one_line
from drift_cli.suite import store
from drift_cli.suite.spec import Cell, Suite

EXECUTORS = ("local", "ray")
Outcome = tuple[str, Any]          # ("ok", {"run", "steps", "wall_s", "host"}) or ("error", message)
INTERRUPTED: Outcome = ("error", "interrupted: the run is incomplete")


def execute_cell(settings: dict) -> Outcome:
    """One cell: a bench run. Never raises for the cell's own failures (they travel back as text)."""
    from drift_cli.bench import BenchConfig, run_bench
    from drift_cli.console import quiet_libraries
    from drift_cli.results import method_errors

    quiet_libraries()
    t0 = time.perf_counter()
    try:
        run, steps = run_bench(BenchConfig(**settings, out=Path(".")))
    except BadInput as e:
        return "error", str(e)
    except Exception as e:  # noqa: BLE001 - reported per cell; the other cells go on
        return "error", one_line(e)
    failed = method_errors(run)
    if failed:           # a method that raised fails its cell, as it did before the others were kept
        return "error", "; ".join(failure_line(name, error) for name, error in failed.items())
    if not run["complete"]:
        return INTERRUPTED
    return "ok", {"run": run, "steps": steps, "wall_s": time.perf_counter() - t0, "host": socket.gethostname()}


def build_plan(cells: list[Cell]) -> dict[str, list]:
    """What the cells need built before they start, so that parallel cells never build one thing twice."""
    from drift_cli.bench import CONTROL_SCENARIO
    from drift_cli.methods import resolve_methods

    from drift_cli.zoo.presets import draft_variant

    zoos, scenarios, offline, heads = set(), set(), set(), set()
    for c in cells:
        s = c.settings
        zoo = draft_variant(s["zoo"], s.get("draft_layers"))   # validated with the cell (validate_cell)
        if s["corpus"] is None:
            scenarios.add(s["scenario"])
            if s["control"]:
                scenarios.add(CONTROL_SCENARIO)
        if s["draft"] is None:
            zoos.add(zoo)
            eagle = s.get("drafter") == "eagle"
            if eagle:
                heads.add((zoo, None, None))
            if s["corpus"] is None and "offline" in resolve_methods(s["methods"]) and not s["options"].get("offline_draft"):
                divergence = s["options"].get("divergence") or "fkl"
                if eagle:
                    heads.add((zoo, s["scenario"], divergence))
                else:
                    offline.add((zoo, s["scenario"], divergence, bool(s["options"].get("offline_on_policy"))))
    return {"zoos": sorted(zoos), "scenarios": sorted(scenarios), "offline": sorted(offline),
            "heads": sorted(heads, key=lambda h: (h[0], h[1] or "", h[2] or ""))}


def prepare(plan: dict[str, list]) -> str:
    """Build (or find cached) everything in the plan on this machine; returns its host name."""
    from drift_cli import scenarios
    from drift_cli.console import quiet_libraries
    from drift_cli.zoo import ensure_offline_draft, ensure_zoo

    quiet_libraries()
    for zoo in plan["zoos"]:
        ensure_zoo(zoo)
    for name in plan["scenarios"]:
        scenarios.build(name)
    for zoo, scenario, divergence, on_policy in plan["offline"]:
        ensure_offline_draft(zoo, scenario, divergence, on_policy)
    for zoo, scenario, divergence in plan.get("heads", []):      # --drafter eagle: the zoo's heads
        from drift_cli.zoo.presets import pretrained_preset
        from drift_cli.zoo.pretrained import ensure_pretrained_head, ensure_pretrained_offline_head

        if scenario is None:
            ensure_pretrained_head(pretrained_preset(zoo))
        else:
            ensure_pretrained_offline_head(pretrained_preset(zoo), scenario, divergence)
    return socket.gethostname()


# --- local -------------------------------------------------------------------------------------

def _pool_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the driver handles Ctrl-C and stops the pool


def _pool_task(item: tuple[str, dict]) -> tuple[str, Outcome]:
    key, settings = item
    return key, execute_cell(settings)


def local_results(cells: list[Cell], jobs: int) -> Iterator[tuple[Cell, Outcome]]:
    """jobs = 1: the cells one after another in this process; otherwise a pool of `jobs` processes."""
    prepare(build_plan(cells))
    if jobs == 1:
        for cell in cells:
            interrupt.check()
            outcome = execute_cell(cell.settings)
            if outcome == INTERRUPTED:
                raise KeyboardInterrupt   # Ctrl-C inside the cell: it stays missing, the run stops
            yield cell, outcome
        return
    import multiprocessing

    by_key = {c.key: c for c in cells}
    pool = multiprocessing.get_context("spawn").Pool(min(jobs, len(cells)), initializer=_pool_init)
    try:
        for key, outcome in pool.imap_unordered(_pool_task, [(c.key, c.settings) for c in cells]):
            interrupt.check()
            yield by_key[key], outcome
        pool.close()
    finally:
        pool.terminate()   # after Ctrl-C: cells in flight are dropped; finished ones are written
        pool.join()


# --- Ray ---------------------------------------------------------------------------------------

def ray_module():
    try:
        import ray
    except ImportError:
        raise BadInput("--executor ray needs Ray: pip install 'drift-bench[ray]'") from None
    return ray


def _cell_resources(cell: Cell) -> dict[str, float]:
    device = str(cell.settings["device"])
    return {"num_cpus": cell.settings["threads"] or 1, "num_gpus": 1 if device.startswith("cuda") else 0}


def ray_results(cells: list[Cell], address: str | None, cpus: int) -> Iterator[tuple[Cell, Outcome]]:
    """Cells as Ray tasks. Without an address a local Ray instance of `cpus` CPUs starts and stops here.
    Ray's own messages (a dead worker, ...) go to stderr: stdout stays the command's (--json)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield from _ray_results(cells, address, cpus)


def _ray_results(cells: list[Cell], address: str | None, cpus: int) -> Iterator[tuple[Cell, Outcome]]:
    ray = ray_module()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        else:
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise BadInput(f"cannot start or join Ray{f' at {address}' if address else ''}: {one_line(e)}") from None
    pending: dict = {}
    try:
        plan = build_plan(cells)
        prep = ray.remote(prepare)
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        try:   # once per node, not once per cell
            ray.get([prep.options(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                     .remote(plan) for n in nodes])
        except ray.exceptions.RayError as e:
            raise BadInput(f"preparing the Ray nodes failed: {one_line(e)}") from None
        task = ray.remote(execute_cell)
        for cell in cells:
            ref = task.options(max_retries=0, name=f"cell-{cell.key}", **_cell_resources(cell)).remote(cell.settings)
            pending[ref] = cell
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                cell = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as e:   # a lost worker or node
                    outcome = ("error", one_line(e))
                yield cell, outcome
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()


# --- the driver --------------------------------------------------------------------------------

def _manifest(root: Path, suite: Suite, executor: str, jobs: int, timings: dict[str, float]) -> None:
    path = root / "suite.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    wall = {**old.get("wall_s", {}), **timings}
    atomic_write_json(path, {"suite": suite.name, "file": str(suite.path), "executor": executor, "jobs": jobs,
                             "threads": sorted({c.settings["threads"] or 1 for c in suite.cells}),
                             "cells": {c.key: dict(c.coords) for c in suite.cells}, "wall_s": wall})


def run_suite(suite: Suite, root: Path, executor: str = "local", jobs: int = 1, address: str | None = None,
              on_cell: Callable[[Cell, Outcome, int, int], None] | None = None) -> dict:
    """Run the cells that are not done; write each as it arrives. Returns the summary."""
    done = store.finished_cells(root)
    todo = [c for c in suite.cells if c.key not in done]
    summary: dict[str, Any] = {"suite": suite.name, "dir": str(root), "cells": len(suite.cells),
                               "already_done": len(suite.cells) - len(todo), "executed": [], "failed": {}}
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if not todo:
        summary["wall_s"] = 0.0
        return summary
    results = local_results(todo, jobs) if executor == "local" else ray_results(todo, address, jobs)
    store.mark_running(root, (c.key for c in todo))
    try:
        for n, (cell, outcome) in enumerate(results, 1):
            kind, payload = outcome
            if kind == "ok":
                store.write_cell(root, cell, suite, payload["run"], payload["steps"])
                timings[cell.key] = payload["wall_s"]
                summary["executed"].append(cell.key)
            else:
                store.write_failure(root, cell, payload)
                summary["failed"][cell.key] = payload
            store.clear_running(root, cell.key)
            if on_cell:
                on_cell(cell, outcome, n, len(todo))
    finally:
        results.close()   # stops the executor's workers (and a Ray instance this run started)
        for c in todo:
            store.clear_running(root, c.key)
        summary["wall_s"] = round(time.perf_counter() - t0, 3)
        _manifest(root, suite, executor, jobs, timings)
    return summary
