"""The command line: a real bench run on a saved pair, and bad input -> one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drift_cli.cli import main
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")  # real text every Debian system has


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("mismatch"), draft_extra=" zebra quagga okapi " * 50)


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def bench_args(pair, out, *extra):
    d, t = pair
    return ["bench", "--corpus", str(CORPUS), "--draft", str(d), "--target", str(t), "--max-prompts", "2",
            "--max-new-tokens", "10", "--out", str(out), *extra]


def test_bench_json_writes_a_complete_run(pair, tmp_path, capsys):
    code, out, err = run_cli(bench_args(pair, tmp_path, "--methods", "vanilla", "--json"), capsys)
    assert code == 0, err
    run = json.loads(out)  # stdout carries run.json and nothing else
    assert run["schema_version"] == 1 and run["complete"] is True
    assert set(run["methods"]) == {"ar", "vanilla"}
    assert run["methods"]["vanilla"]["ar_match_rate"] == 1.0
    assert run["models"]["draft"]["fingerprint"] != run["models"]["target"]["fingerprint"]
    run_dir = tmp_path / run["scenario"] / run["run_id"]
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == run["run_id"]
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert {s["method"] for s in steps} == {"ar", "vanilla"}
    assert (run_dir / "acceptance.png").stat().st_size > 0 and (run_dir / "speedup.png").stat().st_size > 0
    assert not [p for p in run_dir.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers
    # drift report re-renders the saved run
    code, out, err = run_cli(["report", str(run_dir)], capsys)
    assert code == 0 and "vanilla" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["bench", "--scenario", "jargn"], "unknown scenario 'jargn' (did you mean 'jargon'?)"),
        (["bench", "--methods", "vanila"], "unknown method 'vanila' (did you mean 'vanilla'?)"),
        (["bench", "--gamma", "0"], "Invalid value for '--gamma': must be >= 1, got 0"),
        (["bench", "--temperature", "-0.5"], "Invalid value for '--temperature': must be 0 (greedy) or in [0.0001, 10000]"),
        (["bench", "--top-p", "1.5"], "Invalid value for '--top-p': must be in [1e-06, 1]"),
        (["bench", "--draft", "/nonexistent/d", "--target", "/nonexistent/t", "--corpus", str(CORPUS)],
         "draft checkpoint not found: /nonexistent/d"),
        (["bench", "--draft", "/x"], "give both --draft and --target"),
        (["bench", "--zoo", "mikro", "--methods", "ar"], "unknown preset 'mikro' (did you mean 'micro'?)"),
        (["bench", "--gamma", "four"], "'four' is not a valid integer"),
        (["bench", "--zoo", "small", "--draft-layers", "4"], "--draft-layers applies to the pretrained presets"),
        (["bench", "--zoo", "smollm", "--draft-layers", "0"], "Invalid value for '--draft-layers': must be in [1, 4096], got 0"),
        (["bench", "--draft", "/x", "--target", "/y", "--draft-layers", "4"], "it does not apply with --draft/--target"),
        (["report", "/nonexistent/run"], "no run.json at /nonexistent/run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and out == ""


def test_mismatched_tokenizers_exit_2(mismatched, tmp_path, capsys):
    code, _, err = run_cli(bench_args(mismatched, tmp_path, "--methods", "vanilla"), capsys)
    assert code == 2 and "tokenizers differ" in err and len(err.strip().splitlines()) == 1


def test_unwritable_out_dir_exit_2(pair, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    code, _, err = run_cli(bench_args(pair, blocker / "results"), capsys)
    assert code == 2 and "is not writable" in err and len(err.strip().splitlines()) == 1


def test_subprocess_has_no_traceback():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-m", "drift_cli", "bench", "--methods", "nope"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown method 'nope'; choose from: " + ", ".join(
        sorted(__import__("drift_cli.methods", fromlist=["METHODS"]).METHODS.names()))
