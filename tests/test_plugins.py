"""Methods from other packages: an entry point of the group `drift_bench.methods` adds a drafter,
with its own flags, without editing drift_cli (tests/plugin holds a tiny one, `echo`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models import saved_pair

PLUGIN = Path(__file__).parent / "plugin"
CORPUS = Path("/usr/share/common-licenses")


def drift(*args: str) -> subprocess.CompletedProcess:
    """`drift ARGS` in a fresh interpreter with the plugin's directory on sys.path (as if installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN), str(Path(__file__).parent.parent)]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", "from drift_cli.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("pair"))


def test_a_plugin_method_runs_through_drift_bench(pair, tmp_path):
    d, t = pair
    res = drift("bench", "--corpus", str(CORPUS), "--draft", str(d), "--target", str(t), "--methods", "vanilla,echo",
                "--no-control", "--echo-length", "3", "--max-prompts", "2", "--max-new-tokens", "12",
                "--out", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)
    assert run["config"]["methods_run"] == ["ar", "vanilla", "echo"]
    echo = run["methods"]["echo"]
    assert echo["report"]["echo_length"] == 3 and 0 < echo["report"]["proposals"] <= echo["iterations"]
    assert echo["drafted_tokens"] > 0 and echo["ar_match_rate"] == 1.0      # greedy: still the target's output
    assert max(i for i, n in enumerate(echo["accept_length_histogram"]) if n) <= 3


def test_a_plugin_method_has_generated_and_checked_flags():
    res = drift("bench", "--help")
    assert res.returncode == 0 and "--echo-length" in res.stdout and "echo: tokens drafted per iteration" in res.stdout
    bad = drift("bench", "--methods", "echo", "--echo-length", "0")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: Invalid value for '--echo-length': must be >= 1, got 0"


def test_without_the_plugin_on_the_path_the_method_is_unknown():
    from drift_cli.methods import METHODS

    assert "echo" not in METHODS      # this interpreter does not have tests/plugin on sys.path
    res = subprocess.run([sys.executable, "-c", "from drift_cli.cli import main; main()", "bench", "--methods", "echo"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert res.returncode == 2 and "unknown method 'echo'" in res.stderr
