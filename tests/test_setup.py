"""Two `make setup` at once in one tree: both succeed and the venv is installed once.

The venv's Python is a stub that logs each pip call; the first call holds until the second
`make` is waiting on the set-up lock (its `flock` process is seen), so the two really overlap.
Needs the data deps present (scripts/install-data-deps.sh --check): the data-deps step is then a
lookup in both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_suite import _wait_for

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 120   # generous: only a broken lock would take this long

pytestmark = pytest.mark.subprocess

STUB = """#!/bin/sh
echo "start $$ $*" >> "{log}"
if [ ! -e "{go}.first" ]; then
    : > "{go}.first"
    while [ ! -e "{go}" ]; do sleep 0.05; done    # held until the test lets it go
fi
echo "end $$" >> "{log}"
"""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def waiting_on_flock(pid: int) -> bool:
    for c in descendants(pid):
        try:
            if (Path("/proc") / str(c) / "cmdline").read_bytes().split(b"\0")[0].endswith(b"flock"):
                return True
        except OSError:
            continue
    return False


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("flock") is None, reason="needs make and flock")
def test_two_setups_at_once_both_succeed_and_install_once(tmp_path):
    if subprocess.run([str(ROOT / "scripts/install-data-deps.sh"), "--check"], capture_output=True).returncode:
        pytest.skip("the data deps are not installed here (a set-up would run apt)")
    venv, log, go = tmp_path / "venv", tmp_path / "pip.log", tmp_path / "go"
    stub = tmp_path / "python"
    stub.write_text(STUB.format(log=log, go=go))
    stub.chmod(0o755)
    argv = ["make", "-s", "-C", str(ROOT), "setup", f"VENV={venv}", f"PY={stub}"]
    env = {**os.environ, "MAKEFLAGS": ""}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = None
    try:
        _wait_for(lambda: Path(f"{go}.first").exists(), DEADLINE_S, "the first pip call")
        second = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_for(lambda: waiting_on_flock(second.pid), DEADLINE_S, "the second set-up waiting on the lock")
        go.touch()
        out1, _ = first.communicate(timeout=DEADLINE_S)
        out2, _ = second.communicate(timeout=DEADLINE_S)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert first.returncode == 0, out1
    assert second.returncode == 0, out2
    assert "installed by a set-up that ran at the same time" in out2
    lines = log.read_text().splitlines()
    pids = {ln.split()[1] for ln in lines}
    assert len(lines) == 8 and all(ln.startswith("start" if i % 2 == 0 else "end") for i, ln in enumerate(lines))
    assert len([ln for ln in lines if ln.startswith("start")]) == 4 and len(pids) == 4   # one make's 4 installs, in turn
    assert (venv / ".drift-installed").is_file()
