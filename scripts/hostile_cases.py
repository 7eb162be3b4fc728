"""Re-run every recorded case of hostile input and faults on the micro zoo and count them.

    OMP_NUM_THREADS=1 python scripts/hostile_cases.py [--json REPORT.json] [--only SUBSTRING ...]

Each case is a real `drift` process (micro zoo, --max-prompts 2 --max-new-tokens 16) in a temp
directory; it records the exit code, the stderr lines, whether a traceback or a Rust panic was
printed, whether it hung (no exit within 180 s) and whether a file was lost (a device node or
FIFO replaced, a finished run without its run.json, a snapshot half-written). Needs root for
mknod and tmpfs mounts (full and read-only disks); cases that need them are skipped otherwise.
Cases marked `method-flags` are the method flags' own checks (`drift_cli.knobs`); they are run and
counted separately.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
DRIFT = [sys.executable, "-m", "drift_cli"]
SMALL = ["--zoo", "micro", "--max-prompts", "2", "--max-new-tokens", "16"]
HANG_S = 180


@dataclass
class Case:
    name: str
    argv: Callable[["Box"], list[str]]
    expect: str = "exit2"             # exit2 | ok | signal
    owner: str = "input"
    setup: Callable[["Box"], None] | None = None
    lost: Callable[["Box", "Result"], str | None] | None = None   # a description of what was lost, or None
    env: Callable[["Box"], dict] | None = None
    send: tuple[int, float] | None = None                          # (signal, seconds after start)
    after_methods: int = 0          # with send: signal once this many methods have finished instead
    needs_root: bool = False


@dataclass
class Result:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    hung: bool = False
    notes: list[str] = field(default_factory=list)


class Box:
    """The temp directory of one case, with helpers to make hostile files in it."""

    def __init__(self, root: Path):
        self.root = root
        self.out = root / "runs"
        self.mounts: list[Path] = []

    def p(self, name: str) -> Path:
        return self.root / name

    def device(self, name: str = "full") -> Path:
        path = self.p(name)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))   # like /dev/full
        return path

    def fifo(self, name: str = "fifo") -> Path:
        os.mkfifo(self.p(name))
        return self.p(name)

    def tmpfs(self, name: str, options: str) -> Path:
        path = self.p(name)
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        self.mounts.append(path)
        return path

    def cleanup(self) -> None:
        for m in self.mounts:
            subprocess.run(["umount", str(m)], check=False)


def _finished_methods(box: Box) -> list[str]:
    f = box.p("finished-methods")
    return f.read_text().split() if f.exists() else []


def run_case(case: Case, box: Box) -> Result:
    # DRIFT_PROGRESS_INTERVAL off: a slow machine's plain progress lines are not counted as error lines
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DRIFT_PROGRESS_INTERVAL": "off",
           "DRIFT_FINISHED_METHODS_FILE": str(box.p("finished-methods")),
           **(case.env(box) if case.env else {})}
    argv = DRIFT + [str(a) for a in case.argv(box)]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if case.send:
        sig, delay = case.send
        if case.after_methods:      # an event, not a delay: a loaded machine moves every delay
            while len(_finished_methods(box)) < case.after_methods and p.poll() is None \
                    and time.perf_counter() - t0 < HANG_S:
                time.sleep(0.05)
        else:
            time.sleep(delay)
        p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=HANG_S)
        return Result(p.returncode, out, err, time.perf_counter() - t0)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return Result(None, out, err, time.perf_counter() - t0, hung=True)


# ---------------------------------------------------------------- what "lost" means per case

def _run_jsons(box: Box) -> list[dict]:
    return [json.loads((d / "run.json").read_text()) for d in sorted(box.out.glob("*/*"))
            if d.is_dir() and not d.name.startswith(".")] if box.out.exists() else []


def node_intact(name: str, kind: int = stat.S_IFCHR):
    def check(box: Box, r: Result) -> str | None:
        return None if stat.S_IFMT(os.stat(box.p(name)).st_mode) == kind else f"{name} was replaced"
    return check


def run_written(box: Box, r: Result) -> str | None:
    return None if _run_jsons(box) else "the finished run has no run.json"


def signal_outcome(box: Box, r: Result) -> str | None:
    runs = _run_jsons(box)
    temps = [d for d in box.out.glob("*/.*")] if box.out.exists() else []
    if temps:
        return f"temporaries left: {temps}"
    if r.rc == 143 and not runs and "interrupted" in r.stderr and _finished_methods(box):
        return f"SIGTERM after {', '.join(_finished_methods(box))} finished wrote nothing"
    return None


# ---------------------------------------------------------------- fixtures shared by several cases

_SHARED: dict[str, Path] = {}


def shared(name: str) -> Path:
    return _SHARED[name]


def make_shared(root: Path) -> None:
    """A real snapshot and a real baseline of the micro zoo (made once)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    snap, base = root / "bank.safetensors", root / "baseline.json"
    subprocess.run(DRIFT + ["bench", *SMALL, "--methods", "drift", "--no-control", "--out", str(root / "runs"),
                            "--bank-out", str(snap)], env=env, check=True, capture_output=True)
    subprocess.run(DRIFT + ["regress", "pin", "--zoo", "micro", "--max-prompts", "2", "--max-new-tokens", "16",
                            "--out", str(base)], env=env, check=True, capture_output=True)
    _SHARED.update(snapshot=snap, baseline=base)


def edited_snapshot(box: Box, name: str, fn) -> Path:
    """The shared snapshot with one array edited and the checksum made valid again."""
    sys.path.insert(0, str(REPO))
    from safetensors import safe_open
    from safetensors.numpy import save as st_save

    from tests.test_bank_snapshot import checksum

    with safe_open(str(shared("snapshot")), "np") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    tensors[name] = fn(tensors[name].copy())
    meta["drift_bank.checksum"] = checksum(tensors, meta)
    out = box.p("edited.safetensors")
    out.write_bytes(st_save(tensors, metadata=meta))
    return out


def baseline_with(box: Box, value: str) -> Path:
    doc = json.loads(shared("baseline").read_text())
    name = next(iter(doc["methods"]))
    text = json.dumps(doc, indent=2).replace(f'"acceptance_rate": {json.dumps(doc["methods"][name]["acceptance_rate"])}',
                                             f'"acceptance_rate": {value}', 1)
    box.p("nan.json").write_text(text)
    return box.p("nan.json")


def copy_cache(box: Box) -> Path:
    """A temp DRIFT_CACHE_DIR holding the shared micro zoo and scenario splits."""
    shared_cache = Path(os.environ.get("DRIFT_CACHE_DIR") or "~/.cache/drift-bench").expanduser()
    cache = box.p("cache")
    shutil.copytree(shared_cache / "scenarios", cache / "scenarios")
    micro = sorted((shared_cache / "zoo").glob("micro-*"))[-1]
    shutil.copytree(micro, cache / "zoo" / micro.name, ignore=shutil.ignore_patterns("offline", ".*"))
    return cache


def micro_target() -> Path:
    """The micro zoo's target checkpoint (a head by path needs --target)."""
    cache = Path(os.environ.get("DRIFT_CACHE_DIR") or "~/.cache/drift-bench").expanduser()
    return sorted((cache / "zoo").glob("micro-*"))[-1] / "target"


def head(box: Box, kind: str = "eagle3", config: dict | None = None, weight: tuple | None = None,
         name: str = "head") -> Path:
    """An EAGLE head for the micro target (tests/eagle_writer.py), with config.json fields replaced
    and one weight edited: weight = (tensor name, fn)."""
    sys.path.insert(0, str(REPO))
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from tests.eagle_writer import write_eagle1, write_eagle3

    target = AutoModelForCausalLM.from_pretrained(str(micro_target()))
    path = (write_eagle3 if kind == "eagle3" else write_eagle1)(box.p(name), target)
    if config:
        doc = json.loads((path / "config.json").read_text())
        doc.update(config)
        (path / "config.json").write_text(json.dumps(doc))
    if weight:
        tensors = load_file(str(path / "model.safetensors"))
        tensors[weight[0]] = weight[1](tensors[weight[0]].clone())
        save_file(tensors, str(path / "model.safetensors"))
    return path


def nan_head(box: Box, name: str = "head") -> Path:
    return head(box, weight=("norm.weight", lambda t: t.fill_(float("nan"))), name=name)


def pickled_head(box: Box) -> Path:
    import pickle

    path = head(box, kind="eagle")
    from safetensors.torch import load_file

    tensors = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    with open(path / "pytorch_model.bin", "wb") as fh:
        pickle.dump({**tensors, "x": print}, fh)
    return path


def by_path(draft: Path, *extra) -> list:
    return ["bench", "--draft", draft, "--target", micro_target(), "--scenario", "jargon", "--max-prompts", "2",
            "--max-new-tokens", "16", "--no-control", *extra]


def tiny_suite(box: Box, claims: str = "") -> Path:
    path = box.p("tiny.toml")
    path.write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\nmethods = "vanilla"\n'
                    'max_prompts = 1\nmax_new_tokens = 4\ncontrol = false\n[grid]\nseed = [1]\n' + claims)
    return path


CLAIM = ('[[claim]]\nid = 1\ntitle = "t"\nseed = "s"\nquote = "q"\n[[claim.part]]\n'
         'a = { where = { seed = "1" }, metric = "methods.vanilla.acceptance_rate" }\nside = "above"\n'
         'figure = "FIGURE"\nthreshold = THRESHOLD\n')


def claims_suite(box: Box, conf: str = "", figure: str = "a", threshold: str = "0.0") -> Path:
    return tiny_suite(box, f"[claims]\n{conf}\n" + CLAIM.replace("FIGURE", figure).replace("THRESHOLD", threshold))


def run_tiny_suite(box: Box) -> Path:
    path = tiny_suite(box)
    subprocess.run(DRIFT + ["suite", "run", str(path), "--out", str(box.out)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                   check=True, capture_output=True)
    return path


def suite_intact(box: Box, r: Result) -> str | None:
    text = box.p("tiny.toml").read_text()
    runs = list(box.out.rglob("run.json"))
    if not text.startswith("version = 1"):
        return "the suite file was overwritten"
    if not runs or not all(strict_json_ok(f.read_text()) and '"methods"' in f.read_text() for f in runs):
        return "a cell's run.json was overwritten"
    return None


def corrupt_manifest(box: Box) -> None:
    cache = copy_cache(box)
    manifest = next((cache / "zoo").glob("micro-*/manifest.json"))
    doc = json.loads(manifest.read_text())
    doc["recipe"]["components"]["draft"] = "0" * 64
    doc.pop("parameters")
    manifest.write_text(json.dumps(doc))


def manifest_rebuilt(box: Box, r: Result) -> str | None:
    manifest = next((box.p("cache") / "zoo").glob("micro-*/manifest.json"))
    doc = json.loads(manifest.read_text())
    return None if "parameters" in doc and doc["recipe"]["components"]["draft"] != "0" * 64 else \
        "the corrupted manifest was kept"


def _np():
    import numpy as np
    return np


def bench(*extra) -> Callable[[Box], list]:
    return lambda box: ["bench", *SMALL, "--no-control", "--out", box.out, *extra]


CASES: list[Case] = [
    # ---- data lost or clobbered
    Case("bench --bank-out DEVICE-NODE (mknod c 1 7)", lambda b: bench("--methods", "drift", "--bank-out", b.p("full"))(b),
         setup=lambda b: b.device("full"), lost=node_intact("full"), needs_root=True),
    Case("bench --bank-out FIFO", lambda b: bench("--methods", "drift", "--bank-out", b.p("fifo"))(b),
         setup=lambda b: b.fifo(), lost=node_intact("fifo", stat.S_IFIFO)),
    Case("bench --bank-out DIR (after the run: run.json kept)",
         lambda b: bench("--methods", "drift", "--bank-out", b.p("adir"))(b),
         setup=lambda b: b.p("adir").mkdir(), lost=run_written),
    Case("bench --bank-out on a read-only file system",
         lambda b: bench("--methods", "drift", "--bank-out", b.p("ro") / "bank.safetensors")(b),
         setup=lambda b: b.tmpfs("ro", "ro,size=64k"), needs_root=True),
    Case("bench --bank-out on a full disk (run.json kept)",
         lambda b: bench("--methods", "drift", "--bank-out", b.p("disk") / "bank.safetensors")(b),
         setup=lambda b: b.tmpfs("disk", "size=64k"), lost=run_written, needs_root=True),
    Case("SIGINT at 88% of the run (the final write)", bench("--methods", "vanilla,drift"), expect="signal",
         send=(signal.SIGINT, 0.0), lost=signal_outcome),
    Case("SIGTERM mid-run (what finished is written, exit 143)", bench("--methods", "vanilla,drift,pld"),
         expect="signal", send=(signal.SIGTERM, 0.0), after_methods=2, lost=signal_outcome),
    Case("bench --methods vanilla,vanilla", bench("--methods", "vanilla,vanilla")),
    # ---- not JSON
    Case("bench --json (strict JSON, entropy_hi null)", bench("--methods", "vanilla", "--json"), expect="ok"),
    Case("bench --json --bank-in --bank-out", lambda b: bench("--methods", "drift", "--json", "--bank-in",
                                                              shared("snapshot"), "--bank-out", b.p("o.bank"))(b),
         expect="ok"),
    # ---- tracebacks owed one line
    Case("bench --temperature nan", bench("--temperature", "nan")),
    Case("bench --seed 99999999999999999999", bench("--seed", "99999999999999999999")),
    Case("bench --bank-size 10000000000", bench("--methods", "drift", "--bank-size", "10000000000"), owner="method-flags"),
    Case("ablate --sweep bank-size --values 10000000000",
         lambda b: ["ablate", *SMALL, "--out", b.out, "--sweep", "bank-size", "--values", "10000000000"],
         owner="method-flags"),
    Case("bench --device bogus", bench("--device", "bogus")),
    Case("bench --device mps", bench("--device", "mps")),
    Case("bench --device meta", bench("--device", "meta")),
    Case("regress check --device tpu", lambda b: ["regress", "check", "--baseline", shared("baseline"), "--zoo",
                                                  "micro", "--device", "tpu"]),
    Case("bench --corpus DIR (a symlink loop)", lambda b: ["bench", *SMALL, "--out", b.out, "--corpus", b.p("loop")],
         setup=lambda b: b.p("loop").symlink_to("loop")),
    Case("DRIFT_CACHE_DIR=FILE bench", bench("--methods", "vanilla"),
         setup=lambda b: b.p("cachefile").write_text("x"), env=lambda b: {"DRIFT_CACHE_DIR": str(b.p("cachefile"))}),
    Case("DRIFT_CACHE_DIR=FILE zoo build", lambda b: ["zoo", "build", "--preset", "micro"],
         setup=lambda b: b.p("cachefile").write_text("x"), env=lambda b: {"DRIFT_CACHE_DIR": str(b.p("cachefile"))}),
    Case("DRIFT_CACHE_DIR read-only: bench", bench("--methods", "vanilla"),
         setup=lambda b: b.tmpfs("rocache", "ro,size=64k"), env=lambda b: {"DRIFT_CACHE_DIR": str(b.p("rocache"))},
         needs_root=True),
    Case("DRIFT_CACHE_DIR read-only: zoo build", lambda b: ["zoo", "build", "--preset", "micro"],
         setup=lambda b: b.tmpfs("rocache", "ro,size=64k"), env=lambda b: {"DRIFT_CACHE_DIR": str(b.p("rocache"))},
         needs_root=True),
    Case("report FILE", lambda b: ["report", b.p("notes.txt")], setup=lambda b: b.p("notes.txt").write_text("hi\n")),
    Case("report DIR (binary run.json)", lambda b: ["report", b.p("bin")],
         setup=lambda b: (b.p("bin").mkdir(), (b.p("bin") / "run.json").write_bytes(bytes(range(256))))),
    Case("report DIR (run.json is a JSON list)", lambda b: ["report", b.p("lst")],
         setup=lambda b: (b.p("lst").mkdir(), (b.p("lst") / "run.json").write_text("[1, 2]"))),
    Case("report --out DEVICE-NODE", lambda b: ["report", sorted(shared("snapshot").parent.glob("runs/*/*"))[0],
                                                "--out", b.p("full")],
         setup=lambda b: b.device("full"), lost=node_intact("full"), needs_root=True),
    Case("regress pin --out DIR", lambda b: ["regress", "pin", "--zoo", "micro", "--out", b.p("adir")],
         setup=lambda b: b.p("adir").mkdir()),
    Case("regress pin --out DEVICE-NODE", lambda b: ["regress", "pin", "--zoo", "micro", "--out", b.p("full")],
         setup=lambda b: b.device("full"), lost=node_intact("full"), needs_root=True),
    Case("bench --out on a full disk (ENOSPC)", lambda b: ["bench", *SMALL, "--no-control", "--methods", "vanilla",
                                                           "--out", b.p("disk")],
         setup=lambda b: b.tmpfs("disk", "size=64k"), needs_root=True),
    Case("SIGINT during import (1.0 s)", bench("--methods", "vanilla"), expect="signal", send=(signal.SIGINT, 1.0),
         lost=signal_outcome),
    Case("SIGTERM during import (1.0 s)", bench("--methods", "vanilla"), expect="signal", send=(signal.SIGTERM, 1.0),
         lost=signal_outcome),
    Case("--bank-in support ids >= vocab (Rust panic before)",
         lambda b: bench("--methods", "drift", "--bank-in", edited_snapshot(b, "support", lambda a: a + 10**6))(b)),
    Case("--bank-in support ids negative",
         lambda b: bench("--methods", "drift", "--bank-in", edited_snapshot(b, "support", lambda a: a - 10**6))(b)),
    # ---- accepted silently
    Case("regress check, NaN acceptance in the baseline", lambda b: ["regress", "check", "--baseline",
                                                                     baseline_with(b, "NaN"), "--zoo", "micro"]),
    Case("regress check, Infinity acceptance in the baseline", lambda b: ["regress", "check", "--baseline",
                                                                          baseline_with(b, "Infinity"), "--zoo",
                                                                          "micro"]),
    Case("--bank-in NaN keys", lambda b: bench("--methods", "drift", "--bank-in",
                                               edited_snapshot(b, "keys", lambda a: a * _np().nan))(b)),
    Case("--bank-in inf bias", lambda b: bench("--methods", "drift", "--bank-in",
                                               edited_snapshot(b, "bias", lambda a: a + _np().inf))(b)),
    Case("--bank-in NaN bias", lambda b: bench("--methods", "drift", "--bank-in",
                                               edited_snapshot(b, "bias", lambda a: a * _np().nan))(b)),
    Case("--bank-in negative counts", lambda b: bench("--methods", "drift", "--bank-in",
                                                      edited_snapshot(b, "counts", lambda a: a - 5))(b)),
    Case("bank inspect, NaN keys", lambda b: ["bank", "inspect", edited_snapshot(b, "keys", lambda a: a * _np().nan)]),
    Case("bench --temperature inf", bench("--temperature", "inf")),
    Case("bench --gain inf", bench("--methods", "drift", "--gain", "inf"), owner="method-flags"),
    Case("bench --methods ''", bench("--methods", "")),
    Case("bench --methods ,,", bench("--methods", ",,")),
    Case("ablate --values nan", lambda b: ["ablate", *SMALL, "--out", b.out, "--sweep", "lambda", "--values", "nan"],
         owner="method-flags"),
    Case("ablate --sweep key --values draft,bogus",
         lambda b: ["ablate", *SMALL, "--out", b.out, "--sweep", "key", "--values", "draft,bogus"], owner="method-flags"),
    Case("ablate --sweep eta --values -1",
         lambda b: ["ablate", *SMALL, "--out", b.out, "--sweep", "eta", "--values", "-1"], owner="method-flags"),
    Case("bench --bank-out without drift", lambda b: bench("--methods", "vanilla", "--bank-out", b.p("x.bank"))(b)),
    Case("bench --split train (documented: train, dev or test)", bench("--split", "train", "--methods", "vanilla"),
         expect="ok", owner="method-flags"),
    Case("bench --max-new-tokens 400 (context 256)", lambda b: ["bench", "--zoo", "micro", "--max-prompts", "2",
                                                                "--max-new-tokens", "400", "--out", b.out]),
    Case("bench --gamma 1000000000", bench("--gamma", "1000000000")),
    Case("corrupted zoo manifest (rebuilt)", bench("--methods", "vanilla"), expect="ok", setup=corrupt_manifest,
         env=lambda b: {"DRIFT_CACHE_DIR": str(b.p("cache"))}, lost=manifest_rebuilt),
    # ---- hangs
    Case("bank inspect FIFO", lambda b: ["bank", "inspect", b.p("fifo")], setup=lambda b: b.fifo()),
    Case("bank inspect /dev/zero", lambda b: ["bank", "inspect", "/dev/zero"]),
    # ---- numeric edges, flags nobody reads, broken files (the micro zoo, jargon, 2 prompts x 16 tokens)
    Case("bench --temperature 1e-300", bench("--temperature", "1e-300")),
    Case("bench --top-p 1e-300 --temperature 0.8", bench("--top-p", "1e-300", "--temperature", "0.8")),
    # runs correctly: the rows decoded together are at most the stream's prompts
    Case("bench --batch-size 1000000000000", bench("--batch-size", "1000000000000"), expect="ok"),
    Case("bench --threads 2147483648", bench("--threads", "2147483648")),
    Case("bench --sigma 1e-300", bench("--methods", "drift", "--sigma", "1e-300"), owner="method-flags"),
    Case("bench --osd-lr 1e300", bench("--methods", "osd", "--osd-lr", "1e300"), owner="method-flags"),
    Case("bench --osd-lr 1e300 --osd-clip 0", bench("--methods", "osd", "--osd-lr", "1e300", "--osd-clip", "0"),
         owner="method-flags"),
    Case("bench --osd-steps 1000000000", bench("--methods", "osd", "--osd-steps", "1000000000"), owner="method-flags"),
    Case("bench --pld-max-ngram 1000000000", bench("--methods", "pld", "--pld-max-ngram", "1000000000"),
         owner="method-flags"),
    Case("bench --gain 0.5 --methods vanilla", bench("--methods", "vanilla", "--gain", "0.5")),
    Case("bench --gamma-p-min 0.5 (fixed controller)", bench("--methods", "vanilla", "--gamma-p-min", "0.5")),
    Case("bench --residuals 5 --methods drift", bench("--methods", "drift", "--residuals", "5")),
    Case("bench --corpus FILE.txt with gzip's magic, not gzip",
         lambda b: ["bench", *SMALL, "--no-control", "--out", b.out, "--corpus", b.p("fake.txt")],
         setup=lambda b: b.p("fake.txt").write_bytes(b"\x1f\x8b\x09" + b"x" * 4000)),
    Case("bench --corpus DIR holding such a file (never 130)",
         lambda b: ["bench", *SMALL, "--no-control", "--out", b.out, "--corpus", b.p("cdir")],
         setup=lambda b: (b.p("cdir").mkdir(), (b.p("cdir") / "a.txt.gz").write_bytes(b"\x1f\x8b\x09" + b"x" * 4000))),
    Case("bench --out with a 300-byte name", lambda b: ["bench", *SMALL, "--no-control", "--methods", "vanilla",
                                                        "--out", b.p("x" * 300)]),
    Case("suite run, a suite file that is not UTF-8", lambda b: ["suite", "run", b.p("bad.toml"), "--out", b.out],
         setup=lambda b: b.p("bad.toml").write_bytes(b"version = 1\n# \xff\xfe\n")),
    Case("suite run, inf where an integer is due",
         lambda b: ["suite", "run", b.p("inf.toml"), "--out", b.out],
         setup=lambda b: b.p("inf.toml").write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\n'
                                                    '[grid]\nmax_prompts = [inf]\n')),
    Case("suite run, [base] given as a number", lambda b: ["suite", "run", b.p("num.toml"), "--set", "zoo=micro",
                                                           "--out", b.out],
         setup=lambda b: b.p("num.toml").write_text("version = 1\nbase = 3\n")),
    Case("suite run, seed = 1.5", lambda b: ["suite", "run", b.p("seed.toml"), "--out", b.out],
         setup=lambda b: b.p("seed.toml").write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\n'
                                                     'seed = 1.5\n')),
    Case("suite run, gamma = true", lambda b: ["suite", "run", b.p("g.toml"), "--out", b.out],
         setup=lambda b: b.p("g.toml").write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\n'
                                                  'gamma = true\n')),
    Case("suite run, a grid of 10^6 cells", lambda b: ["suite", "run", b.p("big.toml"), "--out", b.out],
         setup=lambda b: b.p("big.toml").write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\n'
                                                    '[grid]\nseed = [' + ", ".join(map(str, range(1000)))
                                                    + ']\nmax_new_tokens = [' + ", ".join(map(str, range(1, 1001)))
                                                    + ']\n')),
    # ---- round four: EAGLE heads, the hybrid's knobs, exports, claims (each exit 2, one line)
    Case("head: architectures 7", lambda b: by_path(head(b, config={"architectures": 7}), "--methods", "vanilla")),
    Case("head: target_hidden_size a string", lambda b: by_path(head(b, config={"target_hidden_size": "64"}),
                                                                "--methods", "vanilla")),
    Case("head: an unknown hidden_act", lambda b: by_path(head(b, config={"hidden_act": "bogus"}), "--methods",
                                                          "vanilla")),
    Case("head: EAGLE-1 num_hidden_layers 10^6", lambda b: by_path(head(b, "eagle", {"num_hidden_layers": 10**6}),
                                                                   "--methods", "vanilla")),
    Case("head: zero KV heads", lambda b: by_path(head(b, config={"num_key_value_heads": 0}), "--methods", "vanilla")),
    Case("head: rope_theta 0", lambda b: by_path(head(b, config={"rope_theta": 0}), "--methods", "vanilla")),
    Case("head: empty aux_layers", lambda b: by_path(head(b, config={"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": []}}), "--methods", "vanilla")),
    Case("head: eagle_config a list", lambda b: by_path(head(b, config={"eagle_config": [1]}), "--methods", "vanilla")),
    Case("head: fractional d2t", lambda b: by_path(head(b, weight=("d2t", lambda t: t.double() + 0.5)), "--methods",
                                                   "vanilla")),
    Case("head: a pickled .bin", lambda b: by_path(pickled_head(b), "--methods", "vanilla")),
    Case("head: NaN weights, T 0.8, B 2", lambda b: by_path(nan_head(b), "--methods", "vanilla", "--temperature",
                                                            "0.8", "--batch-size", "2")),
    Case("head: NaN weights as --offline-draft", lambda b: by_path(head(b, name="good"), "--methods", "offline",
                                                                   "--offline-draft", nan_head(b))),
    Case("head: NaN weights pinned by regress", lambda b: ["regress", "pin", "--draft", nan_head(b), "--target",
                                                           micro_target(), "--out", b.p("base.json")]),
    Case("hybrid: --hybrid-min-length under --hybrid-rule score",
         bench("--methods", "hybrid", "--hybrid-rule", "score", "--hybrid-min-length", "3"), owner="method-flags"),
    Case("hybrid: --hybrid-min-length 2^63", bench("--methods", "hybrid", "--hybrid-rule", "length",
                                                   "--hybrid-min-length", str(2**63)), owner="method-flags"),
    Case("hybrid: --hybrid-min-score 1e308", bench("--methods", "hybrid", "--hybrid-min-score", "1e308"),
         owner="method-flags"),
    Case("hybrid: --bank-in (missing) with a hybrid alone",
         lambda b: bench("--methods", "hybrid", "--bank-in", b.p("missing.safetensors"))(b), owner="method-flags"),
    Case("hybrid: --hybrid-learn-copied with a vanilla model side",
         bench("--methods", "hybrid", "--hybrid-model", "vanilla", "--hybrid-learn-copied"), owner="method-flags"),
    Case("--gamma-policy with ar alone", bench("--methods", "ar", "--gamma-policy", "ema"), owner="method-flags"),
    Case("suite export --file SUITE.toml", lambda b: ["suite", "export", b.p("tiny.toml"), "--out", b.out, "--file",
                                                      b.p("tiny.toml")], setup=run_tiny_suite, lost=suite_intact),
    Case("suite export --file a cell's run.json",
         lambda b: ["suite", "export", b.p("tiny.toml"), "--out", b.out, "--file", next(b.out.rglob("run.json"))],
         setup=run_tiny_suite, lost=suite_intact),
    Case("claims: repeat = 3", lambda b: ["suite", "report", claims_suite(b, "repeat = 3"), "--out", b.out,
                                          "--claims", "--claims-out", b.p("c.md")]),
    Case("claims: unknown key", lambda b: ["suite", "report", claims_suite(b, 'colums = "zoo"'), "--out", b.out,
                                           "--claims", "--claims-out", b.p("c.md")]),
    Case("claims: figure max(a)", lambda b: ["suite", "report", claims_suite(b, figure="max(a)"), "--out", b.out,
                                             "--claims", "--claims-out", b.p("c.md")]),
    Case("claims: figure a * 2j", lambda b: ["suite", "report", claims_suite(b, figure="a * 2j"), "--out", b.out,
                                             "--claims", "--claims-out", b.p("c.md")]),
    Case("claims: threshold nan", lambda b: ["suite", "report", claims_suite(b, threshold="nan"), "--out", b.out,
                                             "--claims", "--claims-out", b.p("c.md")]),
    Case("suite status, a grid of 20,000 cells", lambda b: ["suite", "status", b.p("mid.toml"), "--out", b.out],
         expect="ok",
         setup=lambda b: b.p("mid.toml").write_text('version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\n'
                                                    '[grid]\nseed = [' + ", ".join(map(str, range(200)))
                                                    + ']\nmax_new_tokens = [' + ", ".join(map(str, range(1, 101)))
                                                    + ']\n')),
]


def classify(case: Case, r: Result) -> dict:
    err_lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    traceback = "Traceback" in r.stderr or "panicked" in r.stderr
    if case.expect == "exit2":
        clean = r.rc == 2 and len(err_lines) == 1 and not traceback
    elif case.expect == "ok":
        clean = r.rc == 0 and not traceback
    else:   # a signal: 0 if it came after the end, else 130/143 with one line
        clean = not traceback and (r.rc == 0 or (r.rc in (130, 143) and len(err_lines) == 1
                                                        and err_lines[0].startswith("interrupted")))
    return {"clean": clean and not r.hung, "traceback": traceback, "hung": r.hung}


def strict_json_ok(text: str) -> bool:
    def refuse(c):
        raise ValueError(c)
    try:
        json.loads(text, parse_constant=refuse)
        return True
    except ValueError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the per-case results here")
    ap.add_argument("--only", action="append", default=None,
                    help="run only the cases whose name contains this (repeatable: any of them)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hostile-"))
    make_shared(root)
    # the signal delays: measured on the machine, not guessed
    t0 = time.perf_counter()
    subprocess.run(DRIFT + ["bench", *SMALL, "--no-control", "--methods", "vanilla,drift", "--out", str(root / "t")],
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
    duration = time.perf_counter() - t0
    rows = []
    root_user = os.geteuid() == 0
    for case in CASES:
        if args.only and not any(o in case.name for o in args.only):
            continue
        if case.send and case.send[1] == 0.0:
            case.send = (case.send[0], duration * (0.88 if case.send[0] == signal.SIGINT else 0.6))
        if case.needs_root and not root_user:
            rows.append({"case": case.name, "owner": case.owner, "skipped": "needs root"})
            continue
        box = Box(Path(tempfile.mkdtemp(dir=root, prefix="case-")))
        try:
            if case.setup:
                case.setup(box)
            r = run_case(case, box)
            row = {"case": case.name, "owner": case.owner, "rc": r.rc, "seconds": round(r.seconds, 1),
                   **classify(case, r), "stderr": [ln for ln in r.stderr.splitlines() if ln.strip()][-2:]}
            row["lost"] = case.lost(box, r) if case.lost else None
            if "--json" in " ".join(map(str, case.argv(box))) and r.rc == 0:
                row["strict_json"] = strict_json_ok(r.stdout)
                row["clean"] = row["clean"] and row["strict_json"]
            for run in box.out.glob("*/*/run.json") if box.out.exists() else []:
                if not strict_json_ok(run.read_text()):
                    row["clean"], row["strict_json"] = False, False
        finally:
            box.cleanup()
        rows.append(row)
        mark = "ok " if row["clean"] and not row["lost"] else "BAD"
        print(f"{mark} [{row['owner']}] {case.name}: rc {row['rc']} {row['seconds']} s  {' | '.join(row['stderr'])[:150]}"
              + (f"  LOST: {row['lost']}" if row["lost"] else ""), flush=True)
    ran = [r for r in rows if "skipped" not in r]
    mine = [r for r in ran if r["owner"] == "input"]
    summary = {
        "cases": len(ran), "skipped": len(rows) - len(ran),
        "input_cases": len(mine),
        "input_clean": sum(r["clean"] and not r["lost"] for r in mine),
        "exit2_clean": sum(r["clean"] and r["rc"] == 2 for r in ran),
        "tracebacks": sum(r["traceback"] for r in ran),
        "hangs": sum(r["hung"] for r in ran),
        "files_lost": sum(bool(r["lost"]) for r in ran),
        "method_flags_not_clean": [r["case"] for r in ran if r["owner"] == "method-flags" and not r["clean"]],
        "signal_run_s": round(duration, 1),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "cases": rows}, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
