"""A method that raises costs only itself: its row records the error, every other method's results
are written, the run is marked incomplete, exit 1 with one stderr line (`drift --debug`: the
traceback too)."""

from __future__ import annotations

import json

import pytest

from drift_cli import interrupt
from drift_cli.cli import main
from drift_cli.methods.pld import PromptLookup

MICRO = ["--zoo", "micro", "--scenario", "jargon", "--max-prompts", "2", "--max-new-tokens", "8", "--no-control"]


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def pld_raises(monkeypatch):
    """pld raises on its first proposal, as a kernel that fails to compile would."""
    monkeypatch.setenv("DRIFT_DEBUG", "0")      # off; `--debug` sets it for the process, restored after
    monkeypatch.setattr(interrupt, "_received", [])   # no signal from an earlier test in this process

    def propose(self, context, gamma, sampler):
        raise RuntimeError("injected: the kernel did not compile\nsecond line of the message")

    monkeypatch.setattr(PromptLookup, "propose", propose)


def written_run(out_dir):
    (run_json,) = out_dir.glob("*/*/run.json")
    return json.loads(run_json.read_text())


@pytest.mark.parametrize("debug", [False, True])
def test_a_method_that_raises_costs_only_itself(pld_raises, debug, tmp_path, capsys):
    args = (["--debug"] if debug else []) + ["bench", *MICRO, "--methods", "vanilla,pld,suffix", "--out", str(tmp_path)]
    code, out, err = run_cli(args, capsys)
    assert code == 1
    failure = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(failure) == 1 and "method pld failed: RuntimeError: injected: the kernel did not compile" in failure[0]
    assert "second line" not in failure[0]
    assert ("Traceback (most recent call last)" in err) is debug       # the traceback only under --debug
    if not debug:
        assert len(err.strip().splitlines()) == 1, err

    run = written_run(tmp_path)
    assert run["complete"] is False
    assert list(run["methods"]) == ["ar", "vanilla", "suffix", "pld"]   # the later method still ran
    assert run["methods"]["pld"] == {"error": {"type": "RuntimeError",
                                               "message": "injected: the kernel did not compile"}}
    for name in ("vanilla", "suffix"):
        assert run["methods"][name]["ar_match_rate"] == 1.0 and run["methods"][name]["speedup"] is not None
    steps = (tmp_path / run["scenario"] / run["run_id"] / "steps.jsonl").read_text().splitlines()
    assert {json.loads(s)["method"] for s in steps} == {"ar", "vanilla", "suffix"}

    # the readers of run.json take the error row: the table, the CSV export
    code, out, err = run_cli(["report", str(tmp_path / run["scenario"] / run["run_id"])], capsys)
    assert code == 0 and "method pld failed: RuntimeError" in out
    code, out, err = run_cli(["report", "--format", "csv", str(tmp_path / run["scenario"] / run["run_id"])], capsys)
    assert code == 0 and "injected: the kernel did not compile" in out


def test_a_suite_cell_whose_method_raised_is_an_error_not_an_interrupt(pld_raises):
    from drift_cli.suite.executors import execute_cell
    from drift_cli.bench_config import BenchConfig

    cfg = BenchConfig.from_options({"zoo": "micro", "scenario": "jargon", "max_prompts": 1, "max_new_tokens": 4,
                                    "control": False, "methods": "pld"})
    settings = {k: v for k, v in vars(cfg).items() if k != "out"}
    status, text = execute_cell(settings)
    assert (status, text) == ("error", "method pld failed: RuntimeError: injected: the kernel did not compile")
