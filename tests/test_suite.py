"""Suites on the micro zoo: validation, resume, failure isolation, the report, SIGINT and Ray."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drift_cli.cli import main
from drift_cli.results import load_run
from drift_cli.suite import store
from drift_cli.suite.spec import load_suite

ROOT = Path(__file__).resolve().parent.parent
DRIFT = [sys.executable, "-m", "drift_cli"]
BASE = """version = 1
description = "micro test grid"
[base]
zoo = "micro"
methods = "vanilla,pld"
max_prompts = 2
max_new_tokens = {tokens}
temperature = 0.8
control = false
"""
GRID = BASE + """[grid]
scenario = ["code", "law"]
seed = [0, 1]
"""


def write(tmp_path: Path, text: str, name: str = "grid") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def suite_run(path: Path, out: Path, capsys, *extra: str) -> tuple[int, dict]:
    code, stdout, err = run_cli(["suite", "run", str(path), "--out", str(out), "--json", *extra], capsys)
    return code, json.loads(stdout)


def cell_runs(path: Path, out: Path) -> dict[str, dict]:
    suite = load_suite(path)
    root = store.suite_dir(out, suite)
    return {c.key: store.load_cell(root, c.key) for c in suite.cells}


@pytest.fixture(scope="module")
def micro_built():
    from drift_cli.zoo import ensure_zoo

    ensure_zoo("micro")


def _ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


ray_only = pytest.mark.skipif(not _ray_available(), reason="ray is not installed (pip install 'drift-bench[ray]')")


BAD = [
    ("version = 1\n[grid]\ntemprature = [0.0]\n", "unknown setting in [grid] 'temprature' (did you mean 'temperature'?)"),
    ("version = 1\n[base]\nmethods = \"vanila\"\n[grid]\nseed = [0]\n", "unknown method 'vanila' (did you mean 'vanilla'?)"),
    ("version = 1\n[grid]\nscenario = [\"lawz\"]\n", "unknown scenario 'lawz' (did you mean 'law'?)"),
    ("version = 1\n[grid]\nseed = []\n", "[grid] seed is empty: the suite has no cells"),
    ("version = 1\n[base]\nseed = 1\n", "the suite declares no grid"),
    ("version = 1\n[grid\nseed = [0]\n", "not valid TOML"),
    ("version = 1\n[grid]\nbatch_size = [1, 0]\n", "cell batch_size=0: --batch-size must be >= 1, got 0"),
    ("version = 1\n[gird]\nseed = [0]\n", "unknown suite table 'gird' (did you mean 'grid'?)"),
    ("[grid]\nseed = [0]\n", "this drift-bench reads suite version 1"),
    ("version = 1\n[grid]\nseed = 0\n", "[grid] seed must be a list"),
    ("version = 1\n[grid]\ngain = [\"high\"]\n", "gain = 'high'"),
    ("version = 1\n[grid]\ngamma = [0]\n", "cell gamma=0: --gamma must be >= 1, got 0"),
    ("version = 1\n[axes.mode]\ngreedy = { temperature = 0.0 }\n[grid]\ntemperature = [0.8]\n",
     "setting temperature is set by both axis"),
]


@pytest.mark.parametrize("text,message", BAD)
@pytest.mark.parametrize("command", ["run", "status"])
def test_bad_suites_exit_2_with_one_line(tmp_path, capsys, text, message, command):
    code, out, err = run_cli(["suite", command, str(write(tmp_path, text)), "--out", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_bad_suite_in_a_subprocess_has_no_traceback(tmp_path):
    p = write(tmp_path, "version = 1\n[grid\n")
    r = subprocess.run([*DRIFT, "suite", "run", str(p)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_ray_missing_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)       # import ray -> ImportError
    p = write(tmp_path, GRID.format(tokens=8))
    code, out, err = run_cli(["suite", "run", str(p), "--out", str(tmp_path), "--executor", "ray"], capsys)
    assert code == 2 and err.strip() == "error: --executor ray needs Ray: pip install 'drift-bench[ray]'"
    assert sorted(set(_states(p, tmp_path, capsys))) == ["missing"]


@pytest.mark.parametrize("args,message", [
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--address", "1.2.3.4:6379"], "--address joins a Ray cluster: give it with --executor ray"),
    (["--set", "gamma"], "expected KEY=VALUE"),
    (["--set", "gama=3"], "unknown setting in --set 'gama' (did you mean 'gamma'?)"),
])
def test_bad_run_flags_exit_2(tmp_path, capsys, args, message):
    p = write(tmp_path, GRID.format(tokens=8))
    code, out, err = run_cli(["suite", "run", str(p), "--out", str(tmp_path), *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_cells_are_keyed_by_their_resolved_config(tmp_path):
    p = write(tmp_path, GRID.format(tokens=8) + "[axes.knob]\nlow = { pld_max_ngram = 2 }\nhigh = { pld_max_ngram = 4 }\n")
    suite = load_suite(p)
    assert len(suite.cells) == 8 and len({c.key for c in suite.cells}) == 8
    again = {c.coords: c.key for c in load_suite(p).cells}
    assert all(again[c.coords] == c.key for c in suite.cells)          # stable across loads
    # setting a default explicitly resolves to the same cell
    plain = load_suite(write(tmp_path, BASE.format(tokens=8) + "[grid]\nscenario = [\"law\"]\n", "a")).cells[0]
    explicit = load_suite(write(tmp_path, BASE.format(tokens=8) + "gamma = 4\n[grid]\nscenario = [\"law\"]\n", "b")).cells[0]
    assert plain.key == explicit.key
    assert {c.settings["zoo"] for c in load_suite(p, {"zoo": "small"}).cells} == {"small"}


def _parse_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_run_resume_report_and_a_failing_cell(micro_built, tmp_path, capsys):
    from scipy import stats

    p = write(tmp_path, GRID.format(tokens=8))
    out = tmp_path / "out"
    code, summary = suite_run(p, out, capsys, "--jobs", "2")
    assert code == 0 and len(summary["executed"]) == 4 and summary["failed"] == {}
    runs = cell_runs(p, out)
    assert all(r is not None and r["complete"] and r["run_id"] == k for k, r in runs.items())

    # a re-run skips every finished cell; a deleted cell is the only one that runs again
    code, summary = suite_run(p, out, capsys)
    assert code == 0 and summary["executed"] == [] and summary["already_done"] == 4
    suite = load_suite(p)
    root = store.suite_dir(out, suite)
    gone = suite.cells[1].key
    import shutil

    shutil.rmtree(store.cell_dir(root, gone))
    code, summary = suite_run(p, out, capsys)
    assert summary["executed"] == [gone] and summary["already_done"] == 3

    # the report's figures are the cells' run.json figures: mean ± t-CI half-width over the two seeds
    code, text, _ = run_cli(["suite", "report", str(p), "--out", str(out)], capsys)
    assert code in (0, None)
    assert (root / "report.md").read_text().strip() == text.strip()
    assert (root / "acceptance.png").stat().st_size > 0 and (root / "speedup.png").stat().st_size > 0
    assert "every cell ran with 1 torch CPU thread (the `threads` setting)" in text
    lines = text.splitlines()
    head = _parse_row(next(line for line in lines if line.startswith("| scenario")))
    assert head[-1] == "repeats"
    runs = cell_runs(p, out)
    for scenario in ("code", "law"):
        row = dict(zip(head, _parse_row(next(line for line in lines if line.startswith(f"| {scenario} |"))), strict=True))
        group = [r for r in runs.values() if r["scenario"] == scenario]
        assert row["repeats"] == "2"
        for method in ("vanilla", "pld"):
            shown = row[f"{method} α / τ / speedup"].split(" / ")
            assert len(shown) == 3
            for cell, (key, digits) in zip(shown, (("acceptance_rate", 3), ("mean_accepted_length", 2), ("speedup", 2)), strict=True):
                xs = [r["methods"][method][key] for r in group]
                mean = sum(xs) / 2
                half = stats.t.ppf(0.975, 1) * stats.tstd(xs) / math.sqrt(2)
                # each figure is the exact one rounded to its digits: within half a unit of the last
                # digit (a value on a rounding boundary may round either way in another summation order)
                got = [float(v) for v in cell.split(" ± ")]
                assert all(len(v.split(".")[1]) == digits for v in cell.split(" ± ")), cell
                for g, exact in zip(got, (mean, half), strict=True):
                    assert abs(g - exact) <= 0.5 * 10**-digits + 1e-9, (method, key, cell, mean, half)

    # --only: a report of some rows (the cells of scenario law, its two seeds)
    code, text, _ = run_cli(["suite", "report", str(p), "--out", str(out), "--only", "scenario=law"], capsys)
    cells = text.split("## Cells", 1)[1].splitlines()
    assert code in (0, None) and sum(" | law | " in c for c in cells) == 2 and not any(" | code | " in c for c in cells)
    assert "4 cells" not in text and "2 cells: 2 done" in text
    code, _, err = run_cli(["suite", "report", str(p), "--out", str(out), "--only", "scenario=law", "--claims"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1

    # one failing cell is reported with its error; the other cells finish
    bad = write(tmp_path, BASE.format(tokens=8) + "[grid]\ncorpus = [\"/usr/share/common-licenses\", \"/no/such/corpus\"]\n", "bad")
    code, summary = suite_run(bad, out, capsys, "--jobs", "2")
    assert code == 1 and len(summary["executed"]) == 1 and len(summary["failed"]) == 1
    (err,) = summary["failed"].values()
    assert "/no/such/corpus" in err
    assert sorted(_states(bad, out, capsys)) == ["done", "failed"]


def _wait_for(predicate, timeout: float, what: str):
    """Poll predicate until it holds (returning its value); the deadline is only a hang guard."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _done(root: Path) -> list[Path]:
    """Finished cells (not a cell's run.json still being assembled in a hidden temporary directory)."""
    return sorted(f for f in root.glob("*/*/run.json") if not any(part.startswith(".") for part in f.parts[-3:]))


def _states(p: Path, out: Path, capsys) -> list[str]:
    code, stdout, _ = run_cli(["suite", "status", str(p), "--out", str(out), "--json"], capsys)
    assert code == 0
    return [c["state"] for c in json.loads(stdout)["cells"].values()]


def _check_intact_and_resume(p: Path, out: Path, root: Path, done_before: list[Path], total: int, capsys):
    assert not list(root.rglob("*.tmp")), "a half-written cell was left behind"
    for f in done_before:
        run = load_run(f.parent)
        assert run["complete"] and (f.parent / "steps.jsonl").stat().st_size > 0
    code, summary = suite_run(p, out, capsys)
    assert code == 0 and summary["already_done"] == len(done_before)
    assert len(summary["executed"]) == total - len(done_before)     # only the missing cells ran


@pytest.mark.parametrize("executor", [
    ["--jobs", "1"], ["--jobs", "2"],
    pytest.param(["--executor", "ray", "--jobs", "2"], marks=[pytest.mark.slow, ray_only], id="ray"),
])
def test_sigint_keeps_finished_cells_and_a_rerun_runs_only_the_missing(micro_built, tmp_path, capsys, executor):
    p = write(tmp_path, BASE.format(tokens=48) + "[grid]\nscenario = [\"code\", \"law\", \"jargon\"]\nseed = [0, 1]\n")
    out = tmp_path / "out"
    root = out / "grid"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*DRIFT, "suite", "run", str(p), "--out", str(out), *executor], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def mid_run():
        """The states once a cell is done and one running, with two not done (so the run cannot
        finish between this look and the signal); fails at once if the run has ended."""
        assert proc.poll() is None, "the suite ended before it was interrupted"
        st = _states(p, out, capsys)
        return st if "done" in st and "running" in st and len(st) - st.count("done") >= 2 else None

    during = _wait_for(mid_run, 600, "a finished cell beside a running one")   # Ray starts slowly
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "running" in during and "done" in during
    done_before = _done(root)
    assert 1 <= len(done_before) < 6
    after = _states(p, out, capsys)      # the interrupted cell is missing, not failed or running
    assert after.count("done") == len(done_before) and after.count("missing") == 6 - len(done_before)
    _check_intact_and_resume(p, out, root, done_before, 6, capsys)




@pytest.mark.slow
@ray_only
def test_local_and_ray_give_identical_cells(micro_built, tmp_path, capsys):
    p = write(tmp_path, GRID.format(tokens=8))
    code, _ = suite_run(p, tmp_path / "local", capsys)
    assert code == 0
    code, summary = suite_run(p, tmp_path / "ray", capsys, "--executor", "ray", "--jobs", "2")
    assert code == 0 and len(summary["executed"]) == 4
    local, ray = cell_runs(p, tmp_path / "local"), cell_runs(p, tmp_path / "ray")
    assert set(local) == set(ray)
    for key in local:
        for name, m in local[key]["methods"].items():
            r = ray[key]["methods"][name]
            for field in ("acceptance_rate", "mean_accepted_length", "accept_length_histogram", "acceptance_by_position"):
                assert m[field] == r[field], (key, name, field)


def _ray_cell_workers(root_pid: int) -> list[int]:
    """The pids of running `ray::cell-*` tasks under `root_pid` (its cluster's raylet forks them).

    Only this run's descendants: another test's Ray cluster on the same machine (pytest-xdist runs
    tests side by side) has cell workers too, and killing one of those fails the wrong test."""
    parent, cmdline = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
                cmdline[int(d.name)] = (d / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                pass

    def under_root(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid == root_pid:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    return [pid for pid, cmd in cmdline.items() if re.match(rb"ray::cell-", cmd) and under_root(pid)]


@pytest.mark.slow
@ray_only
def test_a_killed_ray_worker_loses_only_its_cell(micro_built, tmp_path, capsys):
    p = write(tmp_path, BASE.format(tokens=48) + "[grid]\nscenario = [\"code\", \"law\", \"jargon\"]\nseed = [0, 1]\n")
    out = tmp_path / "out"
    root = out / "grid"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*DRIFT, "suite", "run", str(p), "--out", str(out), "--executor", "ray", "--jobs", "2",
                             "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: _done(root), 300, "a first finished cell")
    victim = _wait_for(lambda: _ray_cell_workers(proc.pid), 60, "a running cell task of this run")[0]
    os.kill(victim, signal.SIGKILL)
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err                      # one cell failed; the others finished
    summary = json.loads(stdout)
    assert len(summary["failed"]) >= 1 and len(summary["executed"]) + len(summary["failed"]) == 6
    assert all("Error" in e or "died" in e for e in summary["failed"].values()), summary["failed"]
    done_before = _done(root)
    assert len(done_before) == len(summary["executed"])
    _check_intact_and_resume(p, out, root, done_before, 6, capsys)


HEAD = """import time, ray
ray.init(num_cpus=2, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(0.5)
"""


@pytest.mark.slow
@ray_only
def test_address_joins_an_existing_cluster_and_leaves_it_running(micro_built, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")      # the head and this driver share no token file
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        address = head.stdout.readline().strip()
        assert re.fullmatch(r"[\d.]+:\d+", address), address
        p = write(tmp_path, BASE.format(tokens=8) + "[grid]\nscenario = [\"code\", \"law\"]\n")
        for seed in ("0", "1"):       # the second run finds the cluster the first one joined still up
            code, summary = suite_run(p, tmp_path / "out", capsys, "--executor", "ray", "--address", address,
                                      "--set", f"seed={seed}")
            assert code == 0 and len(summary["executed"]) == 2
        assert head.poll() is None
    finally:
        head.terminate()
        head.wait(timeout=60)
