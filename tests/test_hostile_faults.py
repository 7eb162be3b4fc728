"""Faults: a fuzz of bank snapshots, signals at several points of a run, and kill -9
of a bench and of a zoo build.

- fuzz: >= 1000 random mutations of a real snapshot (byte flips, truncations, appends, value
  edits to NaN, inf or out-of-range ids with a valid checksum, header and length edits), each
  through `drift bank inspect` and the `--bank-in` loader in-process: it loads, or it is refused
  with exit 2 / BadInput; never a traceback, a panic or a hang (a generous SIGALRM guard).
- signals (slow): SIGINT and SIGTERM after each method of a run has finished (the
  DRIFT_FINISHED_METHODS_FILE event, not a delay) and around the final write; each leaves a
  run.json marked `"complete": false`, or the complete run, one line on stderr at most, exit
  130/143 (0 if the run had finished).
- crashes (slow): kill -9 of `bench` (8 trials: at once and after each finished method) and of
  `zoo build` (3 trials, after it has written 1, 3 and 6 more files) on the micro zoo in a temp
  DRIFT_CACHE_DIR; no file under a final name is half-written, the next run reuses or rebuilds
  correctly; two concurrent zoo builds into one fresh cache both succeed.
Every kill point is an event the test polls for; none is a delay measured on this machine.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from drift_cli.cli import main
from drift_cli.errors import BadInput
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")
VOCAB = 300
N, M = 64, 8
REPO = Path(__file__).resolve().parent.parent
DRIFT = [sys.executable, "-m", "drift_cli"]


def strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("pair"), vocab=VOCAB)


def bench_argv(pair, out, *extra):
    return ["bench", "--corpus", str(CORPUS), "--draft", str(pair[0]), "--target", str(pair[1]), "--max-prompts", "2",
            "--max-new-tokens", "8", "--no-control", "--out", str(out), *[str(e) for e in extra]]


@pytest.fixture(scope="module")
def snapshot(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("snap")
    path = root / "bank.safetensors"
    with pytest.raises(SystemExit) as exc:
        main(bench_argv(pair, root / "runs", "--methods", "drift", "--bank-size", N, "--support", M, "--tau", "0.2",
                        "--bank-out", path))
    assert exc.value.code == 0 and path.is_file()
    return path


# ---------------------------------------------------------------- fuzz

def _mutations(data: bytes, rng: random.Random, count: int):
    """(kind, bytes) pairs: random damage of the snapshot file `data`."""
    from safetensors.numpy import load as st_load, save as st_save

    from tests.test_bank_snapshot import checksum

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header["__metadata__"]
    tensors = st_load(data)
    values = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}

    def value_edit() -> bytes:
        t = {k: v.copy() for k, v in tensors.items()}
        name = rng.choice(sorted(t))
        flat = t[name].reshape(-1)
        i = rng.randrange(flat.size)
        if flat.dtype.kind == "f":
            flat[i] = values[rng.choice(sorted(values))]
        else:
            flat[i] = rng.choice([-1, -(2**31), VOCAB, VOCAB + 1, 2**31 - 1, 10**12 if flat.dtype == np.int64 else -7])
        m = dict(meta)
        m["drift_bank.checksum"] = checksum(t, m)
        return st_save(t, metadata=m)

    def header_edit() -> bytes:
        h = json.loads(json.dumps(header))
        key = rng.choice([k for k in h if k != "__metadata__"] + ["__metadata__"])
        if key == "__metadata__":
            mk = rng.choice(sorted(h[key]))
            h[key][mk] = rng.choice(["", "0", "{}", "[]", "null", h[key][mk][: len(h[key][mk]) // 2], "2"])
        else:
            field = rng.choice(["dtype", "shape", "data_offsets"])
            h[key][field] = {"dtype": rng.choice(["F64", "BF16", "I8", "U64", "F16", "I32"]),
                             "shape": rng.choice([[0], [N], [N, M + 1], [2**40, 2**40], []]),
                             "data_offsets": rng.choice([[0, 0], [0, 2**62], [5, 3]])}[field]
        body = json.dumps(h).encode()
        return len(body).to_bytes(8, "little") + body + data[8 + n:]

    def length_edit() -> bytes:
        new = rng.choice([0, 1, n - 1, n + 1, len(data), 2**63, 2**64 - 1, rng.randrange(2**32)])
        return new.to_bytes(8, "little") + data[8:]

    def flip() -> bytes:
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)

    kinds = {"flip": flip, "truncate": lambda: data[:rng.randrange(len(data))],
             "append": lambda: data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
             "value": value_edit, "header": header_edit, "length": length_edit}
    names = sorted(kinds)
    for i in range(count):
        kind = names[i % len(names)]
        yield kind, kinds[kind]()


HANG_S = 120   # a mutation that takes this long hangs (a guard: one takes milliseconds, even on a loaded machine)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def test_fuzzed_snapshots_load_or_are_refused(snapshot, tmp_path, capsys):
    """1,200 mutations through `drift bank inspect` and the --bank-in loader."""
    from drift_cli.drift.config import DriftConfig
    from drift_cli.drift.snapshot import load_bank

    meta = json.loads(snapshot.read_bytes()[8:8 + int.from_bytes(snapshot.read_bytes()[:8], "little")])["__metadata__"]
    cfg = DriftConfig.from_json(meta["config"])
    assert (cfg.bank_size, cfg.support) == (N, M)
    rng = random.Random(14)
    path = tmp_path / "m.safetensors"
    outcomes: dict[str, dict[str, int]] = {}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for kind, data in _mutations(snapshot.read_bytes(), rng, 1200):
            path.write_bytes(data)
            signal.alarm(HANG_S)
            try:
                with pytest.raises(SystemExit) as exc:
                    main(["bank", "inspect", str(path), "--json"])
                out, err = capsys.readouterr()
                assert exc.value.code in (0, 2), (kind, err)
                assert "Traceback" not in err and "panicked" not in err
                if exc.value.code == 2:
                    assert len(err.strip().splitlines()) == 1, err
                else:
                    strict_loads(out)
                try:
                    load_bank(path, cfg, 32, VOCAB, torch.device("cpu"), torch.float32, meta["draft_fingerprint"])
                    loaded = "loaded"
                except BadInput as e:
                    assert "\n" not in str(e)
                    loaded = "refused"
            except _Hang:
                pytest.fail(f"{kind} mutation hung for {HANG_S} s")
            finally:
                signal.alarm(0)
            outcomes.setdefault(kind, {}).setdefault(loaded, 0)
            outcomes[kind][loaded] += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert sum(sum(v.values()) for v in outcomes.values()) == 1200
    for kind in ("value", "truncate", "length", "header"):
        assert outcomes[kind].get("refused", 0) > 0, outcomes


def test_fuzzed_snapshots_through_the_real_command(pair, snapshot, tmp_path):
    """A few mutations end to end in a fresh process: `bench --bank-in` and `bank inspect`."""
    rng = random.Random(7)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for i, (kind, data) in enumerate(_mutations(snapshot.read_bytes(), rng, 6)):
        path = tmp_path / f"{i}.safetensors"
        path.write_bytes(data)
        argv = bench_argv(pair, tmp_path / "runs", "--methods", "drift", "--bank-size", N, "--support", M,
                          "--bank-in", path) if i % 2 else ["bank", "inspect", str(path)]
        p = subprocess.run(DRIFT + argv, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        assert p.returncode in (0, 2), (kind, p.stderr)
        assert "Traceback" not in p.stderr and "panicked" not in p.stderr, p.stderr
        if p.returncode == 2:
            assert len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---------------------------------------------------------------- signals

def _run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("*/*") if p.is_dir())


def _check_results(out: Path) -> list[dict]:
    """Every run directory under `out` holds a complete, strict run.json; no temp is left."""
    runs = []
    for d in _run_dirs(out):
        assert not d.name.startswith("."), f"temporary run directory left: {d}"
        runs.append(strict_loads((d / "run.json").read_text()))
        for line in (d / "steps.jsonl").read_text().splitlines():
            strict_loads(line)
    return runs


def _finished(path: Path) -> int:
    """How many methods a bench has announced as finished in its DRIFT_FINISHED_METHODS_FILE."""
    return len(path.read_text().split()) if path.exists() else 0


def _signal_run(pair, out: Path, sig: signal.Signals, after: int, env: dict) -> str:
    """Sends `sig` to a bench as soon as `after` of its methods have finished (the
    DRIFT_FINISHED_METHODS_FILE event; ar, vanilla, drift, pld in turn) and checks what it left.

    Returns "nothing" (stopped before a method finished), "incomplete" or "complete"."""
    finished = out.parent / f"{out.name}.finished"
    p = subprocess.Popen(DRIFT + bench_argv(pair, out, "--methods", "vanilla,drift,pld"),
                         env={**env, "DRIFT_FINISHED_METHODS_FILE": str(finished)}, cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and _finished(finished) < after:
        time.sleep(0.01)       # polling an event, bounded by the child's own run
    p.send_signal(sig)
    _, err = p.communicate(timeout=600)
    assert "Traceback" not in err, (sig.name, after, err)
    assert p.returncode in (0, 128 + sig), (sig.name, after, p.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if p.returncode:
        assert len(lines) == 1 and lines[0].startswith("interrupted"), err
    else:
        assert not lines, err
    runs = _check_results(out) if out.exists() else []
    assert len(runs) <= 1
    if p.returncode == 0:
        assert runs and runs[0]["complete"] is True
    if not runs:
        return "nothing"
    if runs[0]["complete"]:   # finished, or the signal came after the final write (while printing)
        return "complete"
    assert p.returncode == 128 + sig and "ar" in runs[0]["methods"]
    return "incomplete"


@pytest.mark.slow
def test_signals_at_several_points_leave_nothing_or_a_complete_run(pair, tmp_path):
    """Each signal after 1, 2 and 3 of the four methods (ar, vanilla, drift, pld) have finished:
    what finished is written, marked incomplete."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for sig in (signal.SIGINT, signal.SIGTERM):
        for after in (1, 2, 3):
            got = _signal_run(pair, tmp_path / f"{sig.name}-after-{after}", sig, after, env)
            assert got == "incomplete", (sig.name, after, got)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_once_every_method_has_finished_keeps_the_run(pair, tmp_path, sig):
    """After all four methods, around the final write: the run is written (complete, or marked
    incomplete), never lost."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    got = _signal_run(pair, tmp_path / f"{sig.name}-after-all", sig, 4, env)
    assert got in ("incomplete", "complete"), (sig.name, got)


@pytest.mark.faults
@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_async_osd_trains_leaves_no_worker_and_keeps_the_run(pair, tmp_path, sig):
    """osd --osd-async: the signal comes once the worker has started an update (the
    DRIFT_OSD_UPDATES_FILE event). The process exits (a worker thread left alive would keep it
    running), with 130/143, one line on stderr, and a run.json marked incomplete holding ar and
    osd's finished prompts. (In-process, tests/test_osd_async.py interrupts inside an update.)"""
    out, updates = tmp_path / "runs", tmp_path / "updates"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DRIFT_OSD_UPDATES_FILE": str(updates)}
    argv = bench_argv(pair, out, "--methods", "osd", "--osd-async", "--osd-interval", "1", "--osd-steps", "50")
    argv[argv.index("--max-prompts") + 1], argv[argv.index("--max-new-tokens") + 1] = "6", "48"
    p = subprocess.Popen(DRIFT + argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and not updates.exists():
        time.sleep(0.01)       # polling an event, bounded by the child's own run
    p.send_signal(sig)
    _, err = p.communicate(timeout=600)
    assert "Traceback" not in err, err
    runs = _check_results(out)
    if p.returncode == 0:      # the stream ended before the signal landed: the run is complete
        assert runs and runs[0]["complete"] is True
        return
    assert p.returncode == 128 + sig, (p.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted"), err
    (run,) = runs
    assert run["complete"] is False and "ar" in run["methods"] and "osd" in run["methods"]
    assert run["methods"]["osd"]["complete"] is False


# ---------------------------------------------------------------- crashes

SHARED_CACHE = Path(os.environ.get("DRIFT_CACHE_DIR") or "~/.cache/drift-bench").expanduser()


def _fresh_cache(root: Path, with_zoo: bool) -> Path:
    """A temp DRIFT_CACHE_DIR with the shared scenario splits (and the micro zoo if asked)."""
    root.mkdir(parents=True)
    if (SHARED_CACHE / "scenarios").is_dir():
        shutil.copytree(SHARED_CACHE / "scenarios", root / "scenarios")
    if with_zoo:
        micro = sorted((SHARED_CACHE / "zoo").glob("micro-*"))
        if not micro:
            pytest.skip("no micro zoo in the shared cache (drift zoo build --preset micro)")
        shutil.copytree(micro[-1], root / "zoo" / micro[-1].name, ignore=shutil.ignore_patterns("offline", ".*"))
    return root


def _final_files(root: Path) -> list[Path]:
    """Files under final names: no path component starts with a dot (temporaries and locks do)."""
    return [p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)]


def _check_cache(cache: Path) -> None:
    """Every JSON under a final name parses; every component with a build.json has the weights it records."""
    import hashlib

    for f in _final_files(cache / "zoo"):
        if f.suffix == ".json":
            strict_loads(f.read_text())
    for build in (cache / "zoo").glob("micro-*/*/build.json"):
        if any(part.startswith(".") for part in build.relative_to(cache / "zoo").parts):
            continue     # a killed build's temporary: never read, removed by the next build
        info = json.loads(build.read_text())
        assert (build.parent / "recipe.json").is_file(), build   # written last, so complete
        if info.get("weights_sha256"):   # the weights are the ones the build recorded, whole
            h = hashlib.sha256()
            for w in sorted(build.parent.glob("*.safetensors")):
                h.update(w.read_bytes())
            assert h.hexdigest() == info["weights_sha256"], build
    for manifest in (cache / "zoo").glob("micro-*/manifest.json"):
        m = json.loads(manifest.read_text())
        for k in ("tokenizer", "target", "draft"):
            assert json.loads((manifest.parent / k / "recipe.json").read_text())["hash"] == m["recipe"]["components"][k]


def _zoo_env(cache: Path) -> dict:
    return {**os.environ, "DRIFT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_kill_9_of_bench_leaves_no_half_written_file(tmp_path):
    from drift_cli import _bank

    cache = _fresh_cache(tmp_path / "cache", with_zoo=True)
    env, out, snap = _zoo_env(cache), tmp_path / "runs", tmp_path / "bank.safetensors"
    argv = DRIFT + ["bench", "--zoo", "micro", "--methods", "vanilla,drift", "--max-prompts", "2",
                    "--max-new-tokens", "16", "--no-control", "--out", str(out), "--bank-out", str(snap)]
    manifest = next((cache / "zoo").glob("micro-*/manifest.json"))
    before = manifest.stat().st_mtime_ns
    subprocess.run(argv, capture_output=True, timeout=600, env=env, cwd=REPO, check=True)
    # killed at once, and as soon as 1, 2 and all 3 methods (ar, vanilla, drift) have finished:
    # the last is the final write of the run and the bank; twice each
    for trial, after in enumerate([0, 1, 2, 3] * 2):
        finished = tmp_path / f"finished-{trial}"
        p = subprocess.Popen(argv, env={**env, "DRIFT_FINISHED_METHODS_FILE": str(finished)}, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None and _finished(finished) < after:
            time.sleep(0.01)       # polling an event, bounded by the child's own run
        p.kill()
        p.wait()
        for d in _run_dirs(out):    # a run directory under its final name is always whole
            if not d.name.startswith("."):
                strict_loads((d / "run.json").read_text())
                assert (d / "steps.jsonl").is_file()
        if snap.exists():
            _bank.read_snapshot_summary(str(snap))   # raises if half-written
        _check_cache(cache)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert manifest.stat().st_mtime_ns == before, "the zoo was rebuilt although it was complete"
    _bank.read_snapshot_summary(str(snap))


@pytest.mark.slow
def test_kill_9_of_a_zoo_build_then_rebuild_and_concurrent_builds(tmp_path):
    cache = _fresh_cache(tmp_path / "cache", with_zoo=False)
    env = _zoo_env(cache)
    argv = DRIFT + ["zoo", "build", "--preset", "micro", "--json"]
    # killed as soon as the build has written 1, 3 and 6 more files into the cache (each kill
    # leaves files behind, so a later build resumes past more of them)
    def written() -> int:
        return sum(1 for _ in (cache / "zoo").rglob("*")) if (cache / "zoo").exists() else 0

    for more in (1, 3, 6):
        start = written()
        p = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None and written() < start + more:
            time.sleep(0.01)       # polling an event, bounded by the child's own run
        p.kill()
        p.wait()
        _check_cache(cache)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr
    manifest = strict_loads(p.stdout)
    _check_cache(cache)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert again.returncode == 0 and strict_loads(again.stdout)["hash"] == manifest["hash"]

    fresh = _fresh_cache(tmp_path / "fresh", with_zoo=False)
    procs = [subprocess.Popen(argv, env=_zoo_env(fresh), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=1200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1] for r in results]
    hashes = {strict_loads(r[0])["hash"] for r in results}
    assert hashes == {manifest["hash"]}
    builds = [d for d in (fresh / "zoo").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(builds) == 1
    assert not [d for d in builds[0].iterdir() if d.name.startswith(".")], "temporaries left behind"
    _check_cache(fresh)
