"""Run results on disk: `results/<scenario>/<run-id>/{run.json, steps.jsonl, *.png}`.

Everything is written atomically: the run directory is assembled under a temporary name and
renamed into place (run.json first, then steps and plots), and single files go through
`drift_cli.atomic` (temp file + fsync + rename). An existing run is never touched, so an
interrupted run cannot damage earlier results. All JSON is strict (no NaN or Infinity).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, TypedDict

from drift_cli import interrupt
from drift_cli.atomic import strict_json
from drift_cli.errors import BadInput

SCHEMA_VERSION = 1


class RunJson(TypedDict, total=False):
    schema_version: int
    run_id: str
    scenario: str
    split: str
    complete: bool
    created: str
    config: dict[str, Any]
    env: dict[str, Any]
    models: dict[str, Any]
    seeds: dict[str, int]
    stream: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    control: dict[str, dict[str, Any]]
    comparisons: dict[str, Any]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("drift_cli", "torch", "transformers", "tokenizers", "triton", "numpy", "safetensors"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional packages
            out[mod] = "absent"
    return out


def git_revision() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        if rev.returncode:
            return "unknown"
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware() -> str:
    import torch

    cpu = f"{platform.machine()} {os.cpu_count()} cores"
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}; {cpu}"
    return f"cpu-only; {cpu}; torch threads {torch.get_num_threads()}"


def environment() -> dict[str, Any]:
    from drift_cli import machine

    return {"versions": versions(), "git": git_revision(), "hardware": hardware(), "machine": machine.describe(),
            "platform": platform.platform(), "argv": sys.argv}


def new_run_id(label: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{label}-{os.getpid() % 10000:04d}"


def check_writable(out: Path) -> Path:
    """Fail early (BadInput) when the output directory cannot be created or written."""
    out = Path(out)
    try:   # exists() itself raises for a name too long (ENAMETOOLONG), as mkdir does
        if out.exists() and not out.is_dir():
            raise BadInput(f"output directory {out} exists and is not a directory")
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".probe.", delete=True)
        probe.close()
    except OSError as e:
        raise BadInput(f"output directory {out} is not writable: {e.strerror or e}") from None
    return out


def write_run(out_root: Path, run: RunJson, steps: Iterable[dict], plots: bool = True) -> Path:
    """Write one run directory atomically; returns its final path.

    SIGINT/SIGTERM are held until it is done (`interrupt.deferred`): a finished run is written
    whole, and the signal is raised after."""
    with interrupt.deferred():
        return _write_run(Path(out_root) / run["scenario"] / run["run_id"], run, steps, plots)


def _write_run(final: Path, run: RunJson, steps: Iterable[dict], plots: bool) -> Path:
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{run['run_id']}.", suffix=".tmp"))
    except OSError as e:
        raise BadInput(f"cannot write the run under {final.parent}: {e.strerror or e}") from None
    try:
        (tmp / "run.json").write_text(strict_json(run, indent=2) + "\n")
        with open(tmp / "steps.jsonl", "w") as fh:
            for rec in steps:
                fh.write(strict_json(rec) + "\n")
        if plots:
            from drift_cli.plots import plot_run

            plot_run(run, tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BadInput(f"cannot write the run {final}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def method_errors(run: RunJson) -> dict[str, dict]:
    """The methods of a run that raised: name (`control/NAME` for the indist control's) -> their
    row's `error` ({type, message}). Such a row holds nothing else; the run is marked incomplete."""
    rows = [(name, m) for name, m in run.get("methods", {}).items()]
    rows += [(f"control/{name}", m) for name, m in (run.get("control") or {}).items()]
    return {name: m["error"] for name, m in rows if isinstance(m, dict) and m.get("error")}


def load_run(run_dir: Path) -> RunJson:
    """The run.json of a run directory (or the run.json file itself); BadInput when it is not one."""
    path = Path(run_dir) / "run.json" if Path(run_dir).is_dir() else Path(run_dir)
    if not path.is_file():
        raise BadInput(f"no run.json at {run_dir}")
    try:
        run = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{path} is not a run.json (not valid JSON: {e})") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(run, dict) or not isinstance(run.get("methods"), dict):
        raise BadInput(f"{path} is not a run.json (expected an object with 'schema_version' and 'methods')")
    if run.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{path}: schema_version {run.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    problem = _shape_problem(run)
    if problem:
        raise BadInput(f"{path} is not a run.json ({problem})")
    return run


def _shape_problem(run: dict) -> str | None:
    """What is of the wrong JSON type among the tables every reader walks: each method's block, the
    settings and the control stream's blocks (None when they are all objects)."""
    for name, block in run["methods"].items():
        if not isinstance(block, dict):
            return f"methods.{name} is {type(block).__name__}, not an object"
    if not isinstance(run.get("config", {}), dict):
        return f"config is {type(run['config']).__name__}, not an object"
    control = run.get("control")
    if control is not None and not isinstance(control, dict):
        return f"control is {type(control).__name__}, not an object"
    for name, block in (control or {}).items():
        if block is not None and not isinstance(block, dict):
            return f"control.{name} is {type(block).__name__}, not an object"
    return None
