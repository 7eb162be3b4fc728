"""`drift claims index`: every claim of the claim records in one table (docs/claims.md), its
--check, its one-line refusals, and the record `drift suite report --claims` writes beside a report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from drift_cli.cli import main
from drift_cli.suite import claims as C
from drift_cli.suite import claims_index as I
from drift_cli.suite.spec import load_suite

ROOT = Path(__file__).resolve().parent.parent
CLAIMS_SUITE = ROOT / "suites" / "claims.toml"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# --- synthetic records: a suite declaring claims 1-25, a record measuring all but 24 ------------

def _suite_file(suites: Path) -> None:
    claims = "".join(
        f'[[claim]]\nid = {i}\ntitle = "claim number {i}"\nseed = "s.txt"\nquote = "q{i}"\n'
        f'[[claim.part]]\nlabel = "(a) lift"\nfigure = "x"\nx = {{ where = {{ experiment = "a" }}, metric = "m" }}\n'
        f'side = "above"\nthreshold = 0.0\n' for i in range(1, 26))
    suites.mkdir(parents=True, exist_ok=True)
    (suites / "syn.toml").write_text('version = 1\n[base]\nzoo = "micro"\n[grid]\nshuffle = [1, 2, 3]\n'
                                     '[axes.experiment]\na = { scenario = "code", methods = "vanilla" }\n' + claims)


FIGURES = {"confirmed": (0.2, [0.1, 0.3]), "refuted": (-0.2, [-0.3, -0.1]), "inconclusive": (0.0, [-0.1, 0.1]),
           "not measured": (None, None)}


def expected(i: int) -> str:
    return C.VERDICTS[i % 4]


def _record(ids) -> dict:
    claims = []
    for i in ids:
        v = expected(i)
        mean, ci = FIGURES[v]
        m = {"mean": mean, "ci": ci, "n": 3 if mean is not None else 0, "verdict": v,
             "reason": "its 3 cell(s) (experiment=a) have not run" if mean is None else "", "cells": ["k1", "k2"]}
        claims.append({"id": i, "title": f"claim number {i}", "quote": f"q{i}", "source": "s.txt", "gain": False,
                       "pending": "", "columns": {"micro": {"verdict": v, "copying": None, "parts": [m]}},
                       "parts": [{"label": "(a) lift", "figure": "x", "side": "above", "threshold": 0.0,
                                  "operands": [{"name": "x", "metric": "m", "where": {"experiment": ["a"]}}]}]})
    return {"record": C.RECORD_VERSION, "suite": "syn", "suite_file": "suites/syn.toml", "report": "claims-syn.md",
            "quick": False, "selection": "", "derived_from": "cells", "column_settings": ["zoo"],
            "repeat": ["shuffle"], "columns": ["micro"], "claims": claims}


@pytest.fixture()
def tree(tmp_path):
    """docs/claims-records/claims-syn.json (claims 1-25 but 24) and suites/syn.toml (1-25)."""
    _suite_file(tmp_path / "suites")
    rec = tmp_path / "docs" / "claims-records" / "claims-syn.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps(_record([i for i in range(1, 26) if i != 24]), indent=1))
    return tmp_path


def _args(tree: Path, *extra) -> list:
    return ["claims", "index", "--records", tree / "docs" / "claims-records", "--suites", tree / "suites",
            "--out", tree / "docs" / "claims.md", *extra]


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in text.splitlines()
            if re.match(r"^\| \d+ \|", line)]


def test_the_index_has_every_claim_with_its_verdict(tree, capsys):
    code, _, err = run_cli(_args(tree), capsys)
    assert code == 0, err
    text = (tree / "docs" / "claims.md").read_text()
    rows = _rows(text)
    assert [int(r[0]) for r in rows] == list(range(1, 26))           # one row each, in order
    for r in rows:
        i = int(r[0])
        want = "not measured" if i == 24 else I.WORDS[expected(i)]
        assert r[5].startswith(f"**{want}**"), r
        assert r[1] == f"claim number {i}"
    by = {int(r[0]): r for r in rows}
    assert "0.200 [0.100, 0.300], n = 3 → holds" in by[4][3] and by[4][4] == "(a) > 0"
    assert "`syn` ([claims-syn.md](claims-syn.md)) · micro" in by[4][2] and "experiment: a" in by[4][2]
    assert "not measured: its 3 cell(s) (experiment=a) have not run" in by[3][3]
    # claim 24: declared by the suite, in no record
    assert "not measured: no committed claims report measures it yet" in by[24][3]
    assert "drift suite run" in by[24][3] and "--claim 24" in by[24][3] and by[24][4] == "(a) > 0"
    assert "**Verdicts.**" in text and re.search(r"\d{4}-\d\d-\d\d", text) is None     # no dates: stable


def test_check_passes_on_a_fresh_index_and_fails_after_an_edit(tree, capsys):
    assert run_cli(_args(tree), capsys)[0] == 0
    code, _, err = run_cli(_args(tree, "--check"), capsys)
    assert code in (0, None), err
    index = tree / "docs" / "claims.md"
    index.write_text(index.read_text().replace("→ holds", "→ fails", 1))
    code, _, err = run_cli(_args(tree, "--check"), capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "drift claims index" in err
    index.unlink()
    code, _, err = run_cli(_args(tree, "--check"), capsys)
    assert code == 1 and "does not exist" in err and not index.exists()


def _drop(rec: dict, *path) -> dict:
    node = rec
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    return rec


@pytest.mark.parametrize("name, bad, says", [
    ("not JSON", lambda r: "{", "not valid JSON"),
    ("a list", lambda r: [], "not a claim record"),
    ("no threshold", lambda r: _drop(r, "claims", 0, "parts", 0, "threshold"), "has no field 'threshold'"),
    ("no claims", lambda r: _drop(r, "claims"), "has no field 'claims'"),
    ("unknown suite", lambda r: {**r, "suite": "nosuch"}, "unknown suite 'nosuch'"),
    ("a bad verdict", lambda r: (r["claims"][0]["columns"]["micro"].update(verdict="yes"), r)[1], "verdict 'yes'"),
    ("a string mean", lambda r: (r["claims"][0]["columns"]["micro"]["parts"][0].update(mean="0.2"), r)[1],
     "mean is str"),
    ("a missing column", lambda r: (r["claims"][0]["columns"].clear(), r)[1], "the record's columns are"),
])
def test_a_malformed_record_is_one_line_and_exit_2(tree, capsys, name, bad, says):
    rec = tree / "docs" / "claims-records" / "claims-syn.json"
    value = bad(json.loads(rec.read_text()))
    rec.write_text(value if isinstance(value, str) else json.dumps(value))
    code, out, err = run_cli(_args(tree), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert "Traceback" not in err + out and not (tree / "docs" / "claims.md").exists()


def test_an_output_that_is_a_record_is_refused_before_writing(tree, capsys):
    rec = tree / "docs" / "claims-records" / "claims-syn.json"
    before = rec.read_text()
    args = _args(tree)
    args[args.index("--out") + 1] = rec
    code, _, err = run_cli(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--out" in err
    assert rec.read_text() == before
    code, _, err = run_cli(["claims", "index", "--records", tree / "nowhere", "--suites", tree / "suites",
                            "--out", tree / "x.md"], capsys)
    assert code == 2 and "no claim records" in err


def test_the_committed_index_is_what_the_command_writes(capsys):
    """What CI's claims step checks, on the committed records and suites."""
    code, _, err = run_cli(["claims", "index", "--records", ROOT / "docs" / "claims-records", "--suites",
                            ROOT / "suites", "--out", ROOT / "docs" / "claims.md", "--check"], capsys)
    assert code in (0, None), err
    rows = _rows((ROOT / "docs" / "claims.md").read_text())
    assert {int(r[0]) for r in rows} == set(range(1, 26))


# --- the record a report writes: the claims suite's quick variant on made-up finished cells ------

def _fake_cells(out: Path) -> None:
    """A run.json for every cell of the quick variant (no model runs): vanilla and drift α and
    DRIFT's overhead, a little different per shuffle."""
    suite = load_suite(CLAIMS_SUITE, quick=True)
    for c in suite.cells:
        s = int(c.coord("shuffle") or 0)
        run = {"schema_version": 1, "config": {}, "cell": {"coords": dict(c.coords)},
               "methods": {"vanilla": {"acceptance_rate": 0.40 + 0.01 * s, "speedup": 1.0},
                           "drift": {"acceptance_rate": 0.55 + 0.02 * s, "speedup": 1.2, "overhead_pct": 1.0 + 0.1 * s}}}
        d = out / suite.name / "fake" / c.key
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(run))


def test_a_reports_record_reads_into_the_index(tmp_path, capsys):
    out, md = tmp_path / "results", tmp_path / "docs" / "claims-quick.md"
    _fake_cells(out)
    code, _, err = run_cli(["suite", "report", CLAIMS_SUITE, "--quick", "--claims", "--out", out,
                            "--claims-out", md], capsys)
    assert code in (0, None), err
    rec_path = md.parent / "claims-records" / "claims-quick.json"
    rec = json.loads(rec_path.read_text())
    I.check_record(rec, str(rec_path), ROOT / "suites")
    assert rec["suite"] == "claims-quick" and rec["quick"] and rec["columns"] == ["micro / layer"]
    assert [c["id"] for c in rec["claims"]] == list(range(1, 18))
    claim3 = next(c for c in rec["claims"] if c["id"] == 3)["columns"]["micro / layer"]
    part = claim3["parts"][0]
    assert claim3["verdict"] == "confirmed" and part["n"] == 3 and part["ci"][1] < 3 and len(part["cells"]) == 3
    # a report written elsewhere than the suite's [claims] out regenerates into the same file, never
    # over the suite's own report
    assert rec["selection"] == f"--claims-out {md.as_posix()}"
    assert f"--claims --claims-out {md.as_posix()}\n" in md.read_text()
    # the markdown says the same
    row3 = next(line for line in md.read_text().splitlines() if line.startswith("| 3 |"))
    assert f"{C._fmt(part['mean'])} [{C._fmt(part['ci'][0])}, {C._fmt(part['ci'][1])}], n = 3 → confirmed" in row3
    index = tmp_path / "docs" / "claims.md"
    code, _, err = run_cli(["claims", "index", "--records", rec_path.parent, "--suites", ROOT / "suites",
                            "--out", index], capsys)
    assert code in (0, None), err
    by = {int(r[0]): r for r in _rows(index.read_text())}
    assert set(by) == set(range(1, 26))
    assert by[3][5] == "**holds**" and "`claims-quick` ([claims-quick.md](claims-quick.md)) · micro / layer" in by[3][2]
    assert by[24][5] == "**not measured**" and by[25][5] == "**not measured**"     # no record measures them here
    assert f"`drift suite report {CLAIMS_SUITE} --quick --claims-out {md.as_posix()} --claims`" in index.read_text()


def test_the_committed_records_are_the_committed_reports_read_back(monkeypatch):
    """scripts/claims_records_from_md.py made the records of the reports measured before records
    existed; each still reads back from its markdown to the same record, and writes the same rows."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims_records_from_md", ROOT / "scripts" / "claims_records_from_md.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.chdir(ROOT)                  # the reports name their suite files from the repository root
    records = sorted((ROOT / "docs" / "claims-records").glob("*.json"))
    assert records
    for path in records:
        rec = json.loads(path.read_text())
        if rec["derived_from"] != "markdown":
            continue
        md = Path("docs") / rec["report"]
        assert script.record_from_markdown(md) == rec, path.name
        script.check_read_back(md, rec)
