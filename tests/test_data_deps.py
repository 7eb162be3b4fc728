"""`make setup`'s data step (scripts/install-data-deps.sh) is quiet: one line, "all present" or
the packages it installed, with apt's and dpkg's output in a log file. Run against a fake
dpkg-query, apt-get and sudo on PATH: no test runs apt for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-data-deps.sh"
PACKAGES = "fortunes dict-gcide dict-foldoc jargon-text manpages-de manpages-fr manpages-es".split()

DPKG_QUERY = """#!/bin/sh
# dpkg-query -W -f=... PACKAGE: installed when STATE/PACKAGE exists
for last; do :; done
[ -e "{state}/$last" ] && printf 'install ok installed' && exit 0
exit 1
"""

APT_GET = """#!/bin/sh
echo "$*" >> "{state}/apt-calls"
echo "Reading package lists..."
echo "Selecting previously unselected package fortunes." >&2
echo "Setting up dictd (1.13) ..."
case " $* " in
    *" install "*)
        [ -e "{state}/fail" ] && {{ echo "E: Unable to locate package fortunes" >&2; exit 100; }}
        for p in $*; do case "$p" in -*|install|DPkg*) ;; *) : > "{state}/$p" ;; esac; done ;;
esac
exit 0
"""


@pytest.fixture
def fake(tmp_path):
    """A PATH with fake dpkg-query, apt-get and sudo; the state directory marks installed packages."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("dpkg-query", DPKG_QUERY), ("apt-get", APT_GET), ("sudo", '#!/bin/sh\nexec "$@"\n')):
        (bin_dir / name).write_text(text.format(state=state))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           "DRIFT_DATA_DEPS_LOG": str(tmp_path / "logs" / "data-deps.log"), "DRIFT_APT_LOCK_WAIT": "5"}
    return state, env, tmp_path / "logs" / "data-deps.log"


def run(env, *args):
    return subprocess.run(["sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_all_present_is_one_line_and_no_apt(fake):
    state, env, log = fake
    for p in PACKAGES:
        (state / p).touch()
    r = run(env)
    assert r.returncode == 0 and lines(r.stdout) == ["data deps: all present"] and r.stderr == ""
    assert not (state / "apt-calls").exists() and not log.exists()


def test_an_install_prints_one_line_naming_the_packages_and_logs_apt(fake):
    state, env, log = fake
    for p in PACKAGES[2:]:
        (state / p).touch()
    r = run(env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and lines(r.stdout) == [f"data deps: installed fortunes dict-gcide (apt's output: {log})"]
    text = log.read_text()
    assert "Selecting previously unselected package" in text and "Setting up dictd" in text
    assert "install -y -qq --no-install-recommends fortunes dict-gcide" in (state / "apt-calls").read_text()
    assert run(env).stdout.strip() == "data deps: all present"       # installed: the next set-up is a lookup


def test_a_failed_install_is_one_line_pointing_at_the_log(fake):
    state, env, log = fake
    (state / "fail").touch()
    r = run(env)
    assert r.returncode == 1 and r.stdout == ""
    assert lines(r.stderr) == [f"data deps: apt-get install failed (E: Unable to locate package fortunes); "
                               f"its output is in {log}"]
    assert "Reading package lists" in log.read_text()


def test_check_lists_the_missing_without_installing(fake):
    state, env, log = fake
    r = run(env, "--check")
    assert r.returncode == 1 and lines(r.stdout) == ["data deps: missing: " + " ".join(PACKAGES)]
    assert not (state / "apt-calls").exists()
