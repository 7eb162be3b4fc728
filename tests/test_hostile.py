"""Hostile input and faults: each case a new user hit is one line and exit 2, nothing
is lost, every JSON is strict, and no output write ever replaces anything but a regular file.

Table-driven: argv -> exit code + message fragment, on a tiny saved pair and a real corpus.
The subprocess signal, crash and fuzz tests are in test_hostile_faults.py.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from drift_cli.cli import main
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")
VOCAB = 300


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("pair"), vocab=VOCAB)


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def base(pair, out, *extra, corpus=CORPUS):
    d, t = pair
    return ["--corpus", corpus, "--draft", d, "--target", t, "--max-prompts", "2", "--max-new-tokens", "8",
            "--out", out, *extra]


def bench(pair, out, *extra, corpus=CORPUS):
    return ["bench", *base(pair, out, corpus=corpus), "--no-control", *extra]


def assert_one_line(code, err, fragment, want=2):
    assert code == want, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


def strict_loads(text: str):
    """json.loads that refuses NaN and Infinity (RFC 8259), as JavaScript and serde do."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


# ---------------------------------------------------------------- snapshots to feed --bank-in

@pytest.fixture(scope="module")
def snapshot(pair, tmp_path_factory):
    """A real DRIFT bank snapshot of the tiny pair (bank size 64, support 8)."""
    root = tmp_path_factory.mktemp("snap")
    path = root / "bank.safetensors"
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in bench(pair, root / "runs", "--methods", "drift", "--bank-size", "64", "--support", "8",
                                   "--tau", "0.2", "--bank-out", path)])
    assert exc.value.code == 0 and path.is_file()
    return path


def edited_snapshot(snapshot: Path, out: Path, name: str, fn) -> Path:
    """`snapshot` with array `name` replaced by fn(array), re-saved through the real writer (a valid
    checksum), or with the Rust value checks bypassed by a safetensors re-encode if it refuses."""
    from safetensors import safe_open
    from safetensors.numpy import save as st_save

    from tests.test_bank_snapshot import checksum

    with safe_open(str(snapshot), "np") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    tensors[name] = fn(tensors[name].copy())
    meta["drift_bank.checksum"] = checksum(tensors, meta)
    out.write_bytes(st_save(tensors, metadata=meta))
    return out


VALUE_EDITS = {
    "support id = vocab": ("support", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, VOCAB, a),
                           f"out of range for this run's vocabulary of {VOCAB}"),
    "support id huge": ("support", lambda a: a + 10**9, "out of range"),
    "support id negative": ("support", lambda a: a - 10**6, "support value"),
    "NaN key": ("keys", lambda a: np.full_like(a, np.nan), "keys value"),
    "inf bias": ("bias", lambda a: np.full_like(a, np.inf), "bias value"),
    "NaN bias": ("bias", lambda a: np.full_like(a, np.nan), "bias value"),
    "negative count": ("counts", lambda a: a - 5, "counts value"),
}


@pytest.mark.parametrize("what", sorted(VALUE_EDITS))
def test_bank_in_with_values_no_bank_holds_is_refused_before_rust_sees_them(what, pair, snapshot, tmp_path, capsys):
    """The Rust kernels would panic on an out-of-range id: the value never reaches them."""
    name, fn, fragment = VALUE_EDITS[what]
    bad = edited_snapshot(snapshot, tmp_path / "bad.safetensors", name, fn)
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "drift", "--bank-size", "64", "--support",
                                   "8", "--bank-in", bad), capsys)
    assert_one_line(code, err, fragment)
    assert "panicked" not in err
    code, out, err = run_cli(["bank", "inspect", bad], capsys)
    if name == "support" and "range" in fragment:   # the file does not know the vocabulary
        assert code == 0
    else:
        assert_one_line(code, err, fragment)


def test_bank_json_output_with_bank_paths_is_strict_json(pair, snapshot, tmp_path, capsys):
    out_path = tmp_path / "again.safetensors"
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "drift", "--bank-size", "64", "--support",
                                   "8", "--bank-in", snapshot, "--bank-out", out_path, "--json"), capsys)
    assert code == 0, err
    run = strict_loads(out)
    assert run["config"]["options"]["bank_in"] == str(snapshot) and out_path.is_file()


# ---------------------------------------------------------------- flags and paths: argv -> exit 2

@pytest.fixture
def places(tmp_path):
    """Hostile paths: a FIFO, a directory, a text file, binary and list run.json dirs, a symlink loop."""
    p = {"fifo": tmp_path / "fifo", "dir": tmp_path / "adir", "text": tmp_path / "notes.txt",
         "binary_run": tmp_path / "binrun", "list_run": tmp_path / "listrun", "loop": tmp_path / "loop"}
    os.mkfifo(p["fifo"])
    p["dir"].mkdir()
    p["text"].write_text("not a run\n")
    p["binary_run"].mkdir()
    (p["binary_run"] / "run.json").write_bytes(bytes(range(256)))
    p["list_run"].mkdir()
    (p["list_run"] / "run.json").write_text("[1, 2, 3]\n")
    p["loop"].symlink_to(p["loop"].name)
    text = "".join(f"Paragraph {i}: {os.urandom(600).hex()}\n\n" for i in range(20)).encode()
    p["gzip_magic"] = tmp_path / "magic.txt"                 # gzip's magic bytes, then plain text
    p["gzip_magic"].write_bytes(b"\x1f\x8b" + text)
    p["gzip_corrupt"] = tmp_path / "corrupt.txt"             # a gzip header, then no valid deflate data
    p["gzip_corrupt"].write_bytes(gzip.compress(text)[:10] + b"\xff" * 64)
    p["gzip_truncated_dir"] = tmp_path / "truncdir"           # a good corpus file beside a cut-off gzip
    p["gzip_truncated_dir"].mkdir()
    (p["gzip_truncated_dir"] / "good.txt").write_bytes(text)
    (p["gzip_truncated_dir"] / "cut.txt.gz").write_bytes(gzip.compress(text)[:2000])
    p["latin1"] = tmp_path / "latin1.txt"
    p["latin1"].write_bytes(text + "caf\u00e9\n".encode("latin-1"))
    p["long_name"] = tmp_path / ("n" * 300)
    p["long_path"] = tmp_path.joinpath(*["d" * 200] * 25)     # every name fits; the whole path does not
    p["under_file"] = p["text"] / "runs"
    return p


# (id, argv(pair, tmp, places), message fragment)
CASES = [
    ("temperature nan", lambda P, T, X: bench(P, T, "--temperature", "nan"), "--temperature': must be 0 (greedy) or in [0.0001, 10000], got nan"),
    ("temperature inf", lambda P, T, X: bench(P, T, "--temperature", "inf"), "--temperature': must be 0 (greedy) or in [0.0001, 10000], got inf"),
    ("seed huge", lambda P, T, X: bench(P, T, "--seed", "99999999999999999999"), "--seed': must be in [0, 2^63)"),
    ("seed negative", lambda P, T, X: bench(P, T, "--seed", "-1"), "--seed': must be in [0, 2^63)"),
    ("device bogus", lambda P, T, X: bench(P, T, "--device", "bogus"), "--device': must be cpu, cuda, cuda:N or auto"),
    ("device mps", lambda P, T, X: bench(P, T, "--device", "mps"), "--device': must be cpu, cuda, cuda:N or auto"),
    ("device meta", lambda P, T, X: bench(P, T, "--device", "meta"), "--device': must be cpu, cuda, cuda:N or auto"),
    ("methods empty", lambda P, T, X: bench(P, T, "--methods", ""), "names no method"),
    ("methods commas", lambda P, T, X: bench(P, T, "--methods", ",,"), "names no method"),
    ("methods repeated", lambda P, T, X: bench(P, T, "--methods", "vanilla,vanilla"), "names vanilla more than once"),
    ("split bogus", lambda P, T, X: bench(P, T, "--split", "val"), "'val' is not one of 'train', 'dev', 'test'"),
    ("budget past context", lambda P, T, X: bench(P, T, "--methods", "vanilla", "--max-new-tokens", "600"),
     "exceeds the models' context of 512 positions"),
    ("gamma past context", lambda P, T, X: bench(P, T, "--methods", "vanilla", "--gamma", "1000000000"),
     "--gamma 1000000000 exceeds the models' context of 512"),
    ("bank-out without drift", lambda P, T, X: bench(P, T, "--methods", "vanilla", "--bank-out", T / "b.bank"),
     "--bank-out is only used by the drift method"),
    ("bank-in without drift", lambda P, T, X: bench(P, T, "--methods", "vanilla", "--bank-in", T / "b.bank"),
     "--bank-in is only used by the drift method"),
    ("bank-out FIFO", lambda P, T, X: bench(P, T, "--methods", "drift", "--bank-out", X["fifo"]),
     "is not a regular file"),
    ("bank-in FIFO", lambda P, T, X: bench(P, T, "--methods", "drift", "--bank-in", X["fifo"]),
     "is not a regular file"),
    ("corpus symlink loop", lambda P, T, X: ["bench", "--corpus", X["loop"], "--draft", P[0], "--target", P[1]],
     "Symlink loop"),
    ("corpus gzip magic, not gzip", lambda P, T, X: bench(P, T, corpus=X["gzip_magic"]),
     "magic.txt: starts with gzip's magic bytes but is not a valid gzip stream"),
    ("corpus corrupt gzip", lambda P, T, X: bench(P, T, corpus=X["gzip_corrupt"]),
     "corrupt.txt: starts with gzip's magic bytes but is not a valid gzip stream"),
    ("corpus dir, truncated gzip", lambda P, T, X: bench(P, T, corpus=X["gzip_truncated_dir"]),
     "cut.txt.gz: starts with gzip's magic bytes but is not a valid gzip stream"),
    ("corpus not UTF-8", lambda P, T, X: bench(P, T, corpus=X["latin1"]),
     "latin1.txt: not UTF-8 text"),
    ("out name too long", lambda P, T, X: bench(P, X["long_name"]), "File name too long"),
    ("out path too long", lambda P, T, X: bench(P, X["long_path"]), "File name too long"),
    ("out under a file", lambda P, T, X: bench(P, X["under_file"]), "Not a directory"),
    ("report a text file", lambda P, T, X: ["report", X["text"]], "is not a run.json"),
    ("report binary run.json", lambda P, T, X: ["report", X["binary_run"]], "is not a run.json"),
    ("report list run.json", lambda P, T, X: ["report", X["list_run"]], "is not a run.json"),
    ("regress pin --out DIR", lambda P, T, X: ["regress", "pin", "--corpus", CORPUS, "--draft", P[0], "--target", P[1],
                                               "--out", X["dir"]], "--out " + "{dir}" + " is a directory"),
    ("regress pin --out FIFO", lambda P, T, X: ["regress", "pin", "--corpus", CORPUS, "--draft", P[0], "--target",
                                                P[1], "--out", X["fifo"]], "is not a regular file"),
    ("bank inspect FIFO", lambda P, T, X: ["bank", "inspect", X["fifo"]], "not a regular file"),
    ("bank inspect /dev/zero", lambda P, T, X: ["bank", "inspect", "/dev/zero"], "not a regular file"),
    ("bank inspect DIR", lambda P, T, X: ["bank", "inspect", X["dir"]], "Is a directory"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_argv_is_one_line_and_exit_2(case, pair, tmp_path, places, capsys):
    _, argv, fragment = case
    code, out, err = run_cli(argv(pair, tmp_path / "runs", places), capsys)
    assert_one_line(code, err, fragment.format(dir=places["dir"]))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("run.json"))
    assert stat.S_ISFIFO(os.stat(places["fifo"]).st_mode) and places["dir"].is_dir()


def test_an_eof_error_is_not_reported_as_an_interrupt(pair, tmp_path, monkeypatch, capsys):
    """Click turns an EOFError into the Abort it uses for Ctrl-C: without a signal it is no
    "interrupted" and no 130 (what a scheduler would read as a Ctrl-C), but the error itself."""
    def eof(*a, **kw):
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
    monkeypatch.setattr("drift_cli.bench.run_bench", eof)
    with pytest.raises(EOFError, match="end-of-stream"):
        main([str(a) for a in bench(pair, tmp_path / "runs")])
    assert "interrupted" not in capsys.readouterr().err


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only file system (a tmpfs mounted ro: root ignores permission bits); skipped where
    mounting is not allowed."""
    import subprocess

    path = tmp_path / "ro"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("argv", [["zoo", "build", "--preset", "micro"],
                                  ["bench", "--zoo", "micro", "--methods", "vanilla", "--max-prompts", "1"]])
def test_cache_dir_that_is_a_file_is_one_line(argv, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    monkeypatch.setenv("DRIFT_CACHE_DIR", str(cache))
    code, out, err = run_cli([*argv, "--out", tmp_path / "runs"] if argv[0] == "bench" else argv, capsys)
    assert_one_line(code, err, f"DRIFT_CACHE_DIR {cache} is not a directory")


@pytest.mark.parametrize("argv", [["zoo", "build", "--preset", "micro"],
                                  ["bench", "--zoo", "micro", "--methods", "vanilla", "--max-prompts", "1"]])
def test_read_only_cache_dir_is_one_line(argv, read_only_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRIFT_CACHE_DIR", str(read_only_dir))
    code, out, err = run_cli([*argv, "--out", tmp_path / "runs"] if argv[0] == "bench" else argv, capsys)
    assert_one_line(code, err, "Read-only file system")


def test_full_disk_on_out_is_one_line(pair, tmp_path, capsys):
    """A real full disk (a 64 KiB tmpfs) under --out: one line, and no half-written run left."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        code, out, err = run_cli(bench(pair, disk, "--methods", "vanilla"), capsys)
        assert_one_line(code, err, "No space left on device")
        assert not [p for p in disk.rglob("*") if p.is_file()]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_regress_gate_refuses_a_nan_baseline(pair, tmp_path, capsys):
    path = tmp_path / "base.json"
    code, out, err = run_cli(["regress", "pin", "--corpus", CORPUS, "--draft", pair[0], "--target", pair[1],
                              "--max-prompts", "2", "--max-new-tokens", "8", "--out", path, "--json"], capsys)
    assert code == 0, err
    strict_loads(out)
    strict_loads(path.read_text())
    good = path.read_text()
    check = ["regress", "check", "--baseline", path, "--draft", pair[0], "--target", pair[1]]
    code, out, err = run_cli([*check, "--device", "tpu"], capsys)
    assert_one_line(code, err, "--device must be cpu, cuda, cuda:N or auto, got tpu")
    doc = json.loads(good)
    name = next(iter(doc["methods"]))
    for bad in ("NaN", "Infinity", "-Infinity"):
        text = good.replace(f'"acceptance_rate": {doc["methods"][name]["acceptance_rate"]}',
                            f'"acceptance_rate": {bad}', 1)
        assert text != good
        path.write_text(text)
        code, out, err = run_cli(check, capsys)
        assert_one_line(code, err, "holds a non-finite figure")
    doc["methods"][name]["acceptance_rate"] = 1.5
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(check, capsys)
    assert_one_line(code, err, "not in [0, 1]")


# ---------------------------------------------------------------- nothing lost, nothing replaced

def test_failing_bank_out_still_writes_the_run(pair, tmp_path, capsys):
    """--bank-out naming a directory is found out after the run (a run may have several tenants):
    the run.json is written all the same, and the command fails with one line."""
    target = tmp_path / "adir"
    target.mkdir()
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "drift", "--bank-out", target), capsys)
    assert_one_line(code, err, "the run itself was written to")
    runs = list((tmp_path / "runs").rglob("run.json"))
    assert len(runs) == 1 and strict_loads(runs[0].read_text())["complete"] is True
    assert target.is_dir() and not any(target.iterdir())


def test_full_disk_on_out_is_one_line_and_leaves_nothing(pair, tmp_path, monkeypatch, capsys):
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "vanilla"), capsys)
    monkeypatch.setattr(os, "fsync", real)
    assert_one_line(code, err, "No space left on device")
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


def _special_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO always; a character device (like /dev/null: 1, 3) where mknod is allowed (root)."""
    out = {"fifo": tmp_path / "fifo"}
    os.mkfifo(out["fifo"])
    try:
        os.mknod(tmp_path / "device", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        out["device"] = tmp_path / "device"
    except PermissionError:
        pass
    return out


def test_no_output_write_replaces_a_device_node_or_fifo(pair, snapshot, tmp_path, capsys):
    from drift_cli import _bank
    from drift_cli.atomic import atomic_write_bytes, atomic_write_json
    from drift_cli.errors import BadInput

    specials = _special_files(tmp_path)
    if "device" not in specials and os.geteuid() == 0:
        pytest.fail("mknod failed as root")
    books, arrays, meta = _bank.load_snapshot(str(snapshot))
    for kind, node in specials.items():
        mode = os.stat(node).st_mode
        for write in (lambda: atomic_write_bytes(node, b"x"), lambda: atomic_write_json(node, {"a": 1})):
            with pytest.raises(BadInput, match="not a regular file"):
                write()
        with pytest.raises(_bank.SnapshotError, match="not a regular file"):
            _bank.save_snapshot(str(node), books, arrays, meta)
        for argv in (bench(pair, tmp_path / "runs", "--methods", "drift", "--bank-out", node),
                     ["regress", "pin", "--corpus", CORPUS, "--draft", pair[0], "--target", pair[1], "--out", node],
                     ["report", next((snapshot.parent / "runs").rglob("run.json")).parent, "--out", node]):
            code, out, err = run_cli(argv, capsys)
            assert code == 2 and "Traceback" not in err, err
        assert os.stat(node).st_mode == mode, f"{kind} was replaced"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{node.name}")]   # no temp left


def test_sigint_during_the_final_write_keeps_the_complete_run(pair, tmp_path, monkeypatch, capsys):
    """A Ctrl-C while run.json and the plots are written is held until the run directory is in
    place; then the command exits 130 with one line."""
    import signal

    from drift_cli import plots

    real = plots.plot_run

    def plot_then_signal(run, out):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        real(run, out)
    monkeypatch.setattr(plots, "plot_run", plot_then_signal)
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "vanilla"), capsys)
    assert_one_line(code, err, "interrupted", want=130)
    runs = list((tmp_path / "runs").rglob("run.json"))
    assert len(runs) == 1 and strict_loads(runs[0].read_text())["complete"] is True
    assert (runs[0].parent / "acceptance.png").stat().st_size > 0
    assert not [p for p in runs[0].parent.parent.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- strict JSON everywhere

def test_every_json_output_is_strict(pair, tmp_path, capsys):
    """bench, ablate, analyze, report and regress: stdout --json and every file written parse with
    a parser that refuses NaN and Infinity (acceptance_by_entropy's open bucket is null)."""
    out = tmp_path / "runs"
    outputs = []
    for argv in (bench(pair, out, "--methods", "vanilla,drift", "--json"),
                 ["ablate", "--sweep", "lambda", "--values", "0,0.6", *base(pair, out), "--json"],
                 ["analyze", "residuals", *base(pair, out), "--json"],
                 ["regress", "pin", "--corpus", CORPUS, "--draft", pair[0], "--target", pair[1], "--max-prompts", "2",
                  "--max-new-tokens", "8", "--out", tmp_path / "base.json", "--json"],
                 ["regress", "check", "--baseline", tmp_path / "base.json", "--draft", pair[0], "--target", pair[1],
                  "--out", tmp_path / "checks", "--json"]):
        code, text, err = run_cli(argv, capsys)
        assert code == 0, (argv, err)
        outputs.append(strict_loads(text))
    run_dirs = sorted(p.parent for p in out.rglob("run.json"))
    assert len(run_dirs) == 3
    code, text, err = run_cli(["report", *run_dirs, "--json"], capsys)
    assert code == 0, err
    assert len(strict_loads(text)) == 3
    files = [*out.rglob("*.json"), *tmp_path.glob("*.json"), *(tmp_path / "checks").glob("*.json")]
    assert len(files) >= 5
    for f in files:
        strict_loads(f.read_text())
    for f in out.rglob("steps.jsonl"):
        for line in f.read_text().splitlines():
            strict_loads(line)
    buckets = outputs[0]["methods"]["vanilla"]["acceptance_by_entropy"]
    assert buckets[-1]["entropy_hi"] is None and buckets[-1]["entropy_lo"] == 3.0


def test_strict_json_maps_non_finite_to_null():
    from drift_cli.atomic import strict_json

    doc = {"a": math.inf, "b": [math.nan, -math.inf, 1.5], "c": np.float32(np.nan), "d": Path("/x"),
           "e": np.arange(3)}
    assert strict_loads(strict_json(doc)) == {"a": None, "b": [None, None, 1.5], "c": None, "d": "/x",
                                              "e": [0, 1, 2]}


# ---------------------------------------------------------------- the zoo manifest

def test_an_edited_zoo_manifest_is_not_taken_for_a_build(tmp_path, monkeypatch):
    from drift_cli.zoo import build as zb
    from drift_cli.zoo import cache

    recipes = {k: {"hash": f"h-{k}"} for k in zb.COMPONENTS}
    root = tmp_path / "micro-abc"
    for k in zb.COMPONENTS:
        (root / k).mkdir(parents=True)
        cache.write_json_atomic(root / k / "recipe.json", recipes[k])
    good = {"hash": "root", "recipe": {"components": {k: f"h-{k}" for k in zb.COMPONENTS}}}
    cache.write_json_atomic(root / "manifest.json", good)
    assert zb._is_built(root, "root", recipes)
    edits = [
        {**good, "hash": "other"},
        {"hash": "root"},
        {**good, "recipe": {"components": {**good["recipe"]["components"], "draft": "h-x"}}},
        [good],
    ]
    for bad in edits:
        (root / "manifest.json").write_text(json.dumps(bad))
        assert not zb._is_built(root, "root", recipes), bad
    (root / "manifest.json").write_bytes(b"\x00\xff garbage")
    assert not zb._is_built(root, "root", recipes)
    cache.write_json_atomic(root / "manifest.json", good)
    shutil.rmtree(root / "draft")    # a component gone under an intact manifest
    assert not zb._is_built(root, "root", recipes)


def test_entry_point_is_the_signal_safe_main():
    """The `drift` script installs the signal handlers before the slow imports."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["drift"] == "drift_cli.__main__:main"


def test_sigterm_mid_run_writes_what_finished_and_exits_143(pair, tmp_path, monkeypatch, capsys):
    """SIGTERM (schedulers, containers, CI) is Ctrl-C: ar finished, so the run is written, marked
    incomplete, and the command exits 143 with one line."""
    import signal

    from drift_cli import bench as bench_module

    real = bench_module.run_stream

    def terminated_at_vanilla(target, policy, stream, cfg, **kw):
        if policy.name == "vanilla":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(target, policy, stream, cfg, **kw)
    monkeypatch.setattr(bench_module, "run_stream", terminated_at_vanilla)
    code, out, err = run_cli(bench(pair, tmp_path / "runs", "--methods", "vanilla,drift"), capsys)
    assert_one_line(code, err, "interrupted: what finished was written to", want=143)
    runs = list((tmp_path / "runs").rglob("run.json"))
    run = strict_loads(runs[0].read_text())
    assert len(runs) == 1 and run["complete"] is False and list(run["methods"]) == ["ar"]
