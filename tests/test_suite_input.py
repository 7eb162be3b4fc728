"""Hostile suite files: each is refused with one line and exit 2, or handled, before any cell runs;
a grid too large is refused from its axes' sizes, and the status of a large grid is a lookup."""

from __future__ import annotations

import json
import os
import socket

import pytest

from drift_cli.cli import main
from drift_cli.suite import spec, store
from drift_cli.suite.spec import MAX_CELLS, load_suite

MICRO = 'version = 1\n[base]\nzoo = "micro"\nmethods = "vanilla"\nmax_prompts = 1\nmax_new_tokens = 4\ncontrol = false\n'


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def refused(tmp_path, capsys, data: bytes, *extra: str, command: str = "run") -> str:
    p = tmp_path / "hostile.toml"
    p.write_bytes(data)
    code, out, err = run_cli(["suite", command, str(p), "--out", str(tmp_path / "out"), *extra], capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()          # refused before anything was written
    return err


@pytest.mark.parametrize("command", ["run", "status", "report"])
def test_a_suite_that_is_not_utf8_is_one_line(tmp_path, capsys, command):
    err = refused(tmp_path, capsys, 'version = 1\ndescription = "café"\n[grid]\nseed = [0]\n'.encode("latin-1"),
                  command=command)
    assert "not UTF-8 text (byte 0xe9 at offset 30)" in err


@pytest.mark.parametrize("value,message", [
    ("inf", "max_prompts = inf is not a valid integer"),
    ("-inf", "max_prompts = -inf is not a valid integer"),
    ("[1]", "max_prompts = [1] is not a valid integer"),
    ("{ n = 1 }", "max_prompts = {'n': 1} is not a valid integer"),
])
def test_a_grid_value_of_the_wrong_kind_for_an_integer_is_one_line(tmp_path, capsys, value, message):
    err = refused(tmp_path, capsys, f"version = 1\n[grid]\nmax_prompts = [{value}]\n".encode())
    assert f"[grid] max_prompts: {message}" in err


@pytest.mark.parametrize("table", ["base", "grid", "axes"])
@pytest.mark.parametrize("extra", [(), ("--set", "zoo=micro")])
def test_a_table_given_as_a_number_is_one_line(tmp_path, capsys, table, extra):
    grid = "" if table == "grid" else "[grid]\nseed = [0]\n"
    err = refused(tmp_path, capsys, f"version = 1\n{table} = 3\n{grid}".encode(), *extra)
    assert f"[{table}] must be a table" in err


def test_a_million_cell_grid_is_refused_from_its_axes_sizes_without_expanding(tmp_path, capsys, monkeypatch):
    def no_expansion(*args):
        raise AssertionError("a cell was resolved: the grid was expanded before it was counted")

    monkeypatch.setattr(spec, "resolve_cell", no_expansion)
    grid = f"[grid]\nseed = {list(range(100))}\nmax_new_tokens = {list(range(1, 101))}\ngamma = {list(range(1, 11))}\n" \
           f"top_p = {[round(0.05 * i, 2) for i in range(1, 11)]}\n"
    err = refused(tmp_path, capsys, (MICRO + grid).encode())
    assert "the grid has 1,000,000 cells (100 seed × 100 max_new_tokens × 10 gamma × 10 top_p)" in err
    assert f"a suite holds at most {MAX_CELLS:,}" in err


def test_the_cell_limit_is_inclusive(tmp_path):
    axes = [("seed", [("0", {})] * 1000), ("gamma", [("1", {})] * (MAX_CELLS // 1000))]
    spec.check_size(tmp_path, axes)                  # exactly MAX_CELLS: accepted
    with pytest.raises(spec.BadInput, match=f"the grid has {MAX_CELLS + 1000:,} cells"):
        spec.check_size(tmp_path, [*axes[:1], ("gamma", axes[1][1] + [("x", {})])])


def _fake_done(root, cell, scenario="jargon"):
    d = root / scenario / cell.key
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"schema_version": 1, "run_id": cell.key, "scenario": scenario,
                                            "methods": {"vanilla": {"acceptance_rate": 0.5}}}))


def test_status_of_a_20000_cell_grid_is_one_scan_and_reads_only_the_marks_that_exist(tmp_path, capsys, monkeypatch):
    spec._method_knobs.cache_clear()
    p = tmp_path / "big.toml"
    p.write_text(MICRO + f"[grid]\nseed = {list(range(20_000))}\n")
    suite = load_suite(p)
    assert len(suite.cells) == 20_000 and len({c.key for c in suite.cells}) == 20_000
    assert spec._method_knobs.cache_info().misses <= 1   # the method settings are read once, not once per cell
    root = store.suite_dir(tmp_path / "out", suite)
    for c in suite.cells[:3]:
        _fake_done(root, c)
    for c in suite.cells[3:5]:
        store.write_failure(root, c, "RuntimeError: boom")
    store.mark_running(root, [suite.cells[5].key, suite.cells[0].key])   # a done cell's stale mark: still done
    (root / ".running" / f"{suite.cells[6].key}.json").write_text(
        json.dumps({"pid": 2 ** 22 + 1, "host": socket.gethostname()}))   # a dead driver's mark: missing

    reads = []
    for name in ("_running", "failure"):
        fn = getattr(store, name)
        monkeypatch.setattr(store, name, lambda root, key, fn=fn, name=name: reads.append((name, key)) or fn(root, key))
    code, out, _ = run_cli(["suite", "status", str(p), "--out", str(tmp_path / "out"), "--json"], capsys)
    assert code == 0
    cells = json.loads(out)["cells"]
    states = [cells[c.key]["state"] for c in suite.cells]
    assert states[:7] == ["done"] * 3 + ["failed"] * 2 + ["running", "missing"]
    assert states[7:] == ["missing"] * (20_000 - 7)
    assert cells[suite.cells[3].key]["error"] == "RuntimeError: boom"
    # per-cell reads only where a mark exists: the running marks of the not-done cells, the failures
    assert sorted(k for n, k in reads if n == "_running") == sorted([suite.cells[5].key, suite.cells[6].key])
    assert {k for n, k in reads if n == "failure"} == {c.key for c in suite.cells[3:5]}

    code, out, _ = run_cli(["suite", "status", str(p), "--out", str(tmp_path / "out")], capsys)
    assert code == 0
    words = " ".join(out.split())                      # the title wraps at the table's width
    assert "20000 cells (3 done, 1 running, 2 failed, 19994 missing)" in words
    assert "19997 done or missing cells not listed (more than 1,000 cells); --json lists every cell" in words
    assert suite.cells[3].key in out and suite.cells[7].key not in out


def test_marks_are_written_for_every_cell_and_cleared(tmp_path):
    keys = [f"{i:012x}" for i in range(50)]
    store.mark_running(tmp_path, keys)
    assert sorted(f.name for f in (tmp_path / ".running").iterdir()) == sorted(f"{k}.json" for k in keys)
    assert json.loads((tmp_path / ".running" / f"{keys[0]}.json").read_text())["pid"] == os.getpid()
    for k in keys:
        store.clear_running(tmp_path, k)
    assert list((tmp_path / ".running").iterdir()) == []
