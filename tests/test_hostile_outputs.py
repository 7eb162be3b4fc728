"""Hostile input to the commands that read results and write files: run.json tables of the wrong
JSON type, an output path that is one of the command's own inputs, a stdout that cannot take the
output, labels that would break a CSV, and claims tables a suite file gets wrong. Each is one line
and exit 2 (nothing written, nothing replaced), or a correct result."""

from __future__ import annotations

import copy
import csv
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from drift_cli.cli import main
from drift_cli.export import csv_text, run_rows
from drift_cli.suite import store
from drift_cli.suite.spec import load_suite

CORPUS = Path("/usr/share/common-licenses")

SUITE = """version = 1
[base]
zoo = "micro"
methods = "vanilla"
max_prompts = 1
max_new_tokens = 4
control = false
[grid]
scenario = ["code"]
seed = [1, 2]
"""

CLAIM = """
[claims]
columns = "zoo"
repeat = ["seed"]
out = "{out}"

[[claim]]
id = 1
title = "vanilla accepts something"
seed = "s"
quote = "q"
[[claim.part]]
a = {{ where = {{ scenario = "code" }}, metric = "methods.vanilla.acceptance_rate" }}
side = "above"
threshold = 0.0
"""


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_one_line(code, err, fragment, want=2):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == want and len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-cell suite with one claim, run once: (suite file, --out, {key: run dir})."""
    from drift_cli.suite.executors import run_suite

    tmp = tmp_path_factory.mktemp("outputs")
    path = tmp / "tiny.toml"
    path.write_text(SUITE + CLAIM.format(out=tmp / "claims.md"))
    suite = load_suite(path)
    root = store.suite_dir(tmp / "out", suite)
    summary = run_suite(suite, root)
    assert summary["failed"] == {} and len(summary["executed"]) == 2
    return path, tmp / "out", store.finished_cells(root)


def a_run_json(finished) -> Path:
    return next(iter(finished[2].values())) / "run.json"


# ---------------------------------------------------------------- an output that is an input

# (id, argv(suite, out, run.json, tmp), fragment); every one must leave its inputs as they were
SELF_OVERWRITES = [
    ("export --file SUITE", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--file", S],
     "is the suite file this command reads"),
    ("export --file a cell's run.json", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--file", R],
     "is the run.json of cell"),
    ("export --file a symlink to run.json", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--file",
                                                               _link(T / "link.csv", R)], "is the run.json of cell"),
    ("export --file a hard link to SUITE", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--file",
                                                              _hardlink(T / "hard.csv", S)], "is the suite file"),
    ("export --file SUITE by a .. path", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--file",
                                                            S.parent / "x" / ".." / S.name], "is the suite file"),
    ("export parquet --file run.json", lambda S, O, R, T: ["suite", "export", S, "--out", O, "--format", "parquet",
                                                          "--file", R], "is the run.json of cell"),
    ("report --claims --claims-out SUITE", lambda S, O, R, T: ["suite", "report", S, "--out", O, "--claims",
                                                               "--claims-out", S], "is the suite file"),
    ("report --claims --claims-out run.json", lambda S, O, R, T: ["suite", "report", S, "--out", O, "--claims",
                                                                  "--claims-out", R], "is the run.json of cell"),
    ("regress pin --out the corpus", lambda S, O, R, T: ["regress", "pin", "--zoo", "micro", "--corpus",
                                                         _copy(T / "corpus.txt", CORPUS / "GPL-3"), "--out",
                                                         T / "corpus.txt"], "is --corpus this command reads"),
    ("bench --bank-out the --bank-in", lambda S, O, R, T: ["bench", "--zoo", "micro", "--methods", "drift",
                                                           "--no-control", "--out", T / "runs", "--bank-in",
                                                           _copy(T / "b.safetensors", S), "--bank-out",
                                                           T / "b.safetensors"], "is --bank-in this command reads"),
    ("bench --bank-out inside --draft", lambda S, O, R, T: ["bench", "--draft", T, "--target", T, "--corpus",
                                                            CORPUS, "--methods", "drift", "--out", T / "runs",
                                                            "--bank-out", T / "bank.safetensors"], "is inside --draft"),
]


def _link(link: Path, to: Path) -> Path:
    link.symlink_to(to)
    return link


def _hardlink(link: Path, to: Path) -> Path:
    os.link(to, link)
    return link


def _copy(dst: Path, src: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.mark.parametrize("case", SELF_OVERWRITES, ids=[c[0] for c in SELF_OVERWRITES])
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(case, finished, tmp_path, capsys):
    suite, out, cells = finished
    run_json = a_run_json(finished)
    watched = [suite, *[d / "run.json" for d in cells.values()]]
    before = {p: p.read_bytes() for p in watched}
    argv = case[1](suite, out, run_json, tmp_path)
    made = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    code, stdout, err = run_cli(argv, capsys)
    assert_one_line(code, err, case[2])
    assert {p: p.read_bytes() for p in watched} == before
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()} == made
    assert not (tmp_path / "runs").exists()


def test_export_to_a_new_file_beside_the_inputs_works(finished, tmp_path, capsys):
    suite, out, _ = finished
    code, stdout, err = run_cli(["suite", "export", suite, "--out", out, "--file", tmp_path / "cells.csv"], capsys)
    assert code == 0, err
    assert len(list(csv.DictReader(io.StringIO((tmp_path / "cells.csv").read_text(), newline="")))) == 2 * 2


# ---------------------------------------------------------------- run.json tables of the wrong type

WRONG_TYPES = {
    "a method's block a number": lambda r: r["methods"].__setitem__("vanilla", 3),
    "a method's block a list": lambda r: r["methods"].__setitem__("ar", [1, 2]),
    "config a list": lambda r: r.__setitem__("config", ["gamma", 4]),
    "config a string": lambda r: r.__setitem__("config", "gamma=4"),
    "control a string": lambda r: r.__setitem__("control", "none"),
    "control's block a number": lambda r: r.__setitem__("control", {"vanilla": 0.5}),
}


@pytest.mark.parametrize("what", sorted(WRONG_TYPES))
@pytest.mark.parametrize("command", ["report csv", "report table", "suite export"])
def test_a_run_json_with_a_table_of_the_wrong_type_is_one_line(what, command, finished, tmp_path, capsys):
    import shutil

    suite, out, cells = finished
    copied = tmp_path / "out"
    shutil.copytree(out, copied)
    key, run_dir = next(iter(cells.items()))
    bad = copied / run_dir.relative_to(out) / "run.json"
    run = json.loads(bad.read_text())
    WRONG_TYPES[what](run)
    bad.write_text(json.dumps(run))
    argv = {"report csv": ["report", bad.parent, "--format", "csv"], "report table": ["report", bad.parent],
            "suite export": ["suite", "export", suite, "--out", copied, "--file", tmp_path / "x.csv"]}[command]
    code, stdout, err = run_cli(argv, capsys)
    assert_one_line(code, err, "is not a run.json (")
    assert stdout == "" and not (tmp_path / "x.csv").exists()


# ---------------------------------------------------------------- a stdout that cannot take it

class FullStdout(io.StringIO):
    """A stdout on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        import errno

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("argv", [["report", "{run}", "--format", "csv"], ["report", "{run}", "--json"]])
def test_a_stdout_that_cannot_take_the_rows_is_one_line(argv, finished, monkeypatch, capsys):
    import sys

    run_dir = a_run_json(finished).parent
    monkeypatch.setattr(sys, "stdout", FullStdout())
    code, out, err = run_cli([a.format(run=run_dir) for a in argv], capsys)
    assert_one_line(code, err, "cannot write to stdout: No space left on device")


@pytest.mark.subprocess
@pytest.mark.parametrize("argv", [["report", "{run}", "--format", "csv"], ["report", "{run}", "--json"]])
def test_a_full_stdout_is_one_line(argv, finished, tmp_path):
    """`drift report ... > /dev/full`: exit 2 and one line (ENOSPC), not a traceback or a second
    message from the interpreter's flush at exit."""
    import subprocess
    import sys

    run_dir = a_run_json(finished).parent
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "drift_cli", *[a.format(run=run_dir) for a in argv]], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert_one_line(r.returncode, r.stderr, "cannot write to stdout: No space left on device")


# ---------------------------------------------------------------- CSV whatever the labels hold

NASTY = ["a\rb", "a\nb", "a\r\nb", "\r", "\n", '"', '""', 'say "hi", then', ",", ",,", " lead", "trail ", "a\tb",
         "=1+1", "NA", "null", "", "\u00e9\u4e2d\U0001f600", "\x0b\x0c", "\u2028x\u2029", "\\", "#comment", "1e5"]


def _rows(labels: list[str]) -> list[dict]:
    run = {"config": {"gamma": 4, "note": labels[0]}, "scenario": labels[-1],
           "methods": {"ar": {"acceptance_rate": None}, "vanilla": {"acceptance_rate": 0.5, "hist": [1, 2]}}}
    cell = {"suite": labels[0], "key": labels[1 % len(labels)],
            "coords": {f"ax{i}": lab for i, lab in enumerate(labels)}}
    return run_rows(run, cell)


def _round_trip(labels: list[str]) -> None:
    rows = _rows(labels)
    text = csv_text(rows)
    names = list(dict.fromkeys(n for r in rows for n in r))
    read = list(csv.reader(io.StringIO(text, newline="")))
    assert len(read) == 1 + len(rows) and all(len(r) == len(read[0]) for r in read)
    header, body = read[0], read[1:]
    for row, back in zip(rows, body, strict=True):
        got = dict(zip(header, back, strict=True))
        for n in names:
            want = row.get(n)
            assert got[n] == ("" if want is None else str(want)), (n, want, got[n])
    import pandas as pd

    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    assert df.shape == (len(rows), len(header))
    for i, row in enumerate(rows):
        for i_ax, lab in enumerate(labels):
            assert df[f"axis.ax{i_ax}"][i] == lab


@pytest.mark.parametrize("label", NASTY, ids=[repr(x) for x in NASTY])
def test_a_nasty_label_round_trips_through_csv_and_pandas(label):
    _round_trip([label, "plain", label + label])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12), min_size=1, max_size=4))
def test_any_labels_round_trip_through_csv_and_pandas(labels):
    _round_trip(labels)


# ---------------------------------------------------------------- claims tables a suite file gets wrong

def _claims_suite(tmp: Path, claims_conf: str = "", part: str = "") -> Path:
    path = tmp / "c.toml"
    out = tmp / "claims.md"
    body = CLAIM.format(out=out).replace(f'[claims]\ncolumns = "zoo"\nrepeat = ["seed"]\nout = "{out}"\n',
                                         f'[claims]\nout = "{out}"\n' if not claims_conf.startswith("out")
                                         else "[claims]\n")
    body = body.replace("[claims]\n", "[claims]\n" + claims_conf, 1)
    body = body.replace('side = "above"\nthreshold = 0.0\n', part or 'side = "above"\nthreshold = 0.0\n')
    path.write_text(SUITE + body)
    return path


CLAIMS_CASES = [
    ("repeat an integer", dict(claims_conf="repeat = 3\n"), "[claims] repeat must be an axis name or a list"),
    ("repeat a list of integers", dict(claims_conf="repeat = [1, 2]\n"), "[claims] repeat must be"),
    ("out an integer", dict(claims_conf="out = 7\n"), "[claims] out must be a file path, got 7"),
    ("out a table", dict(claims_conf="out = { a = 1 }\n"), "[claims] out must be a file path"),
    ("unknown key", dict(claims_conf="colums = \"zoo\"\n"), "unknown key in"),
    ("repeat a missing axis", dict(claims_conf='repeat = ["shuffle"]\n'), "unknown axis in"),
    ("columns a missing setting", dict(claims_conf='columns = ["zoo", "nonesuch"]\n'), "unknown setting in"),
    ("min()", dict(part='figure = "min()"\nside = "above"\nthreshold = 0.0\n'),
     "figure calls min() with 0 argument(s); it takes 2 or more"),
    ("max(a)", dict(part='figure = "max(a)"\nside = "above"\nthreshold = 0.0\n'),
     "figure calls max() with 1 argument(s)"),
    ("abs(a, a)", dict(part='figure = "abs(a, a)"\nside = "above"\nthreshold = 0.0\n'), "it takes 1"),
    ("a string constant", dict(part="figure = \"a + 'x'\"\nside = \"above\"\nthreshold = 0.0\n"),
     "figure constant 'x' is not a real number"),
    ("a complex number", dict(part='figure = "a * 2j"\nside = "above"\nthreshold = 0.0\n'),
     "figure constant 2j is not a real number"),
    ("a keyword argument", dict(part='figure = "max(a, a, key=a)"\nside = "above"\nthreshold = 0.0\n'),
     "figure calls max()"),
    ("threshold nan", dict(part='side = "above"\nthreshold = nan\n'), "threshold must be a finite number, got nan"),
    ("threshold inf", dict(part='side = "above"\nthreshold = inf\n'), "threshold must be a finite number, got inf"),
    ("threshold -inf", dict(part='side = "below"\nthreshold = -inf\n'), "threshold must be a finite number"),
]


@pytest.mark.parametrize("case", CLAIMS_CASES, ids=[c[0] for c in CLAIMS_CASES])
@pytest.mark.parametrize("command", ["report --claims", "run --claim"])
def test_a_bad_claims_table_is_one_line_before_anything_runs(case, command, tmp_path, capsys):
    path = _claims_suite(tmp_path, **case[1])
    argv = (["suite", "report", path, "--out", tmp_path / "out", "--claims"] if command == "report --claims"
            else ["suite", "run", path, "--out", tmp_path / "out", "--claim", "1"])
    code, out, err = run_cli(argv, capsys)
    assert_one_line(code, err, case[2])
    assert not (tmp_path / "claims.md").exists() and not list((tmp_path / "out").rglob("run.json"))


def test_a_claims_table_it_accepts_reports(finished, capsys):
    suite, out, _ = finished
    code, stdout, err = run_cli(["suite", "report", suite, "--out", out, "--claims"], capsys)
    assert code == 0, err
    assert "vanilla accepts something" in (suite.parent / "claims.md").read_text()


def test_wrong_types_are_copied_not_shared():
    """The table above edits a deep copy: the fixtures stay intact for the next case."""
    run = {"methods": {"vanilla": {}}, "config": {}}
    edited = copy.deepcopy(run)
    WRONG_TYPES["config a list"](edited)
    assert run["config"] == {}


def test_an_output_check_over_a_symlink_loop_is_one_line(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop.name)
    code, out, err = run_cli(["bench", "--zoo", "micro", "--methods", "drift", "--no-control", "--out",
                              tmp_path / "runs", "--bank-out", loop / "bank.safetensors"], capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
