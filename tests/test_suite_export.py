"""`drift suite export` and `drift report --format csv`: rows that pandas loads, one per cell and
method, whose figures are the cells' run.json figures."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import pytest

from drift_cli.cli import main
from drift_cli.export import csv_text, run_rows
from drift_cli.suite import store
from drift_cli.suite.spec import load_suite

pd = pytest.importorskip("pandas")

SUITE = """version = 1
[base]
zoo = "micro"
methods = "vanilla,pld"
max_prompts = 2
max_new_tokens = 8
temperature = 0.8
control = false
[grid]
scenario = ["code", "law"]
[axes.draft]
short = { gamma = 2 }
long = { gamma = 4 }
"""


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 4-cell suite on the micro zoo, run once: (suite file, results root, {key: run.json})."""
    from drift_cli.suite.executors import run_suite
    from drift_cli.zoo import ensure_zoo

    ensure_zoo("micro")
    tmp = tmp_path_factory.mktemp("export")
    p = tmp / "tiny.toml"
    p.write_text(SUITE)
    suite = load_suite(p)
    root = store.suite_dir(tmp / "out", suite)
    summary = run_suite(suite, root)
    assert summary["failed"] == {} and len(summary["executed"]) == 4
    return p, tmp / "out", store.finished_runs(root, suite)


def _same(got, want) -> bool:
    return (want is None and (got is None or (isinstance(got, float) and math.isnan(got)))) or got == want


def _check_rows(df, runs: dict[str, dict]) -> None:
    assert len(df) == sum(len(r["methods"]) for r in runs.values()) == 4 * 3     # cells × (ar, vanilla, pld)
    assert set(df["cell"]) == set(runs)
    for _, row in df.iterrows():
        m = runs[row["cell"]]["methods"][row["method"]]
        for metric in ("acceptance_rate", "speedup", "mean_accepted_length", "tokens_per_s"):
            assert _same(row[metric], m[metric]), (row["cell"], row["method"], metric, row[metric], m[metric])
        assert json.loads(row["accept_length_histogram"]) == m["accept_length_histogram"]
        assert row["config.gamma"] == runs[row["cell"]]["config"]["gamma"]
        assert row["axis.draft"] == {2: "short", 4: "long"}[row["config.gamma"]]
        assert row["axis.scenario"] == row["run.scenario"] == runs[row["cell"]]["scenario"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_has_a_row_per_cell_and_method_with_the_run_json_figures(finished, capsys, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    p, out, runs = finished
    code, stdout, _ = run_cli(["suite", "export", str(p), "--out", str(out), "--format", fmt, "--json"], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["rows"] == 12 and summary["cells"] == 4 and summary["not_done"] == 0
    path = Path(summary["file"])
    assert path == out / "tiny" / f"cells.{fmt}"
    df = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    _check_rows(df, runs)
    assert df["config.options.gain"].isna().all()                 # an unset method flag is an empty column


def test_export_to_a_file_and_of_a_partly_done_suite(finished, tmp_path, capsys):
    p, out, runs = finished
    bigger = tmp_path / "tiny.toml"           # the same suite name and cells, plus two not run
    bigger.write_text(SUITE.replace('["code", "law"]', '["code", "law", "jargon"]'))
    target = tmp_path / "rows.csv"
    code, _, err = run_cli(["suite", "export", str(bigger), "--out", str(out), "--file", str(target)], capsys)
    assert code == 0 and "12 rows (4 cells × their methods; 2 cells not done)" in err
    _check_rows(pd.read_csv(target), runs)


def test_export_refusals_are_one_line(finished, tmp_path, capsys, monkeypatch):
    p, out, _ = finished
    code, _, err = run_cli(["suite", "export", str(p), "--out", str(tmp_path / "empty")], capsys)
    assert code == 2 and "no finished cells of suite tiny" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["suite", "export", str(p), "--out", str(out), "--file", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err
    monkeypatch.setitem(sys.modules, "pyarrow", None)            # import pyarrow -> ImportError
    target = tmp_path / "x.parquet"
    code, _, err = run_cli(["suite", "export", str(p), "--out", str(out), "--format", "parquet", "--file", str(target)],
                           capsys)
    assert code == 2 and err.strip() == "error: --format parquet needs pyarrow: pip install 'drift-bench[export]'"
    assert not target.exists()


def test_report_csv_is_one_row_per_method_of_each_run(finished, capsys):
    _, out, runs = finished
    dirs = sorted(str(d) for d in store.finished_cells(out / "tiny").values())[:2]
    code, stdout, _ = run_cli(["report", *dirs, "--format", "csv"], capsys)
    assert code == 0
    df = pd.read_csv(io.StringIO(stdout))
    chosen = [json.loads((Path(d) / "run.json").read_text()) for d in dirs]
    assert list(df["method"]) == [m for r in chosen for m in r["methods"]]
    assert list(df["run.run_id"]) == [r["run_id"] for r in chosen for _ in r["methods"]]
    assert "cell" not in df.columns                               # a run is not read as a suite cell
    for (_, row), (run, method) in zip(df.iterrows(), [(r, m) for r in chosen for m in r["methods"]], strict=True):
        assert _same(row["acceptance_rate"], run["methods"][method]["acceptance_rate"])
    code, _, err = run_cli(["report", dirs[0], "--format", "csv", "--json"], capsys)
    assert code == 2 and "--json and --format csv" in err


def test_rows_flatten_tables_and_keep_lists_as_json():
    run = {"run_id": "r", "scenario": "law", "config": {"gamma": 4, "options": {"gain": 0.5}},
           "stream": {"distinct_4": 0.9}, "comparisons": {"shift_penalty": None},
           "methods": {"ar": {"speedup": 1.0}, "drift": {"speedup": 1.5, "ci": [1.2, 1.8], "report": {"hits": 3}}},
           "control": {"drift": {"speedup": 1.1}}}
    rows = run_rows(run, {"suite": "s", "key": "k", "coords": {"seed": "0"}})
    assert rows[1] == {"suite": "s", "cell": "k", "axis.seed": "0", "method": "drift", "config.gamma": 4,
                       "config.options.gain": 0.5, "speedup": 1.5, "ci": "[1.2, 1.8]", "report.hits": 3,
                       "control.speedup": 1.1, "run.run_id": "r", "run.scenario": "law", "run.stream.distinct_4": 0.9,
                       "run.comparisons.shift_penalty": None}
    text = csv_text(rows)
    head, ar, drift = csv.reader(io.StringIO(text))
    assert head[:4] == ["suite", "cell", "axis.seed", "method"] and head[-1] == "run.comparisons.shift_penalty"
    assert len(ar) == len(drift) == len(head)                      # every row has every column
    assert dict(zip(head, ar))["ci"] == "" and dict(zip(head, drift))["ci"] == "[1.2, 1.8]"
    assert ar[-1] == drift[-1] == ""                               # an absent value is an empty field
