"""The Python half of scripts/gpu-check.sh: packing what travels, the random-init Llama pairs, and
the summary against the bars. Standard library only, except `llama` (torch, transformers) and
`junit`/`summary` (none): it runs on this machine and on the GPU machine's own Python.

    python scripts/gpu_check.py pack --gpu DIR --wheel LLM_WHEEL --extra FILE... [--budget-mib 64]
    python scripts/gpu_check.py scenarios --dest DIR NAME...     # the cached splits, for DRIFT_DATA_SNAPSHOT=1
    python scripts/gpu_check.py llama --out DIR --size 1b|8b|toy [--device cuda] [--dtype bfloat16]
    python scripts/gpu_check.py junit --xml FILE --out FILE [--interpreter 0|1] [--allow-globals VALUE]
    python scripts/gpu_check.py profiles --out FILE PROFILE_JSON...
    python scripts/gpu_check.py summary --dir DIR --state FILE [--dry-run]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20
MARGIN = 2 * MIB          # below the carry limit: file-system overhead, files added to the tree later
STASH = "/tmp/gpu-check"  # where the calls before the last leave their part on the GPU machine

# The bars (issue text, "Must be true when done"): name -> (limit, unit, how it is read).
BARS = {
    "kernel_tests_pass": "the kernel tests pass without the interpreter and without TRITON_ALLOW_NON_CONSTEXPR_GLOBALS",
    "main_job_complete": "the main job completes on CUDA with every method, each greedy output equal to ar's",
    "retrieval_bias_us": "retrieval + bias add <= 20 us per draft token at N 4096, d 2048, m 32",
    "target_verify_ms": "bf16 target verification at k <= 4 <= 3.5 ms (CUDA graph)",
    "draft_step_ms": "bf16 draft step <= 0.35 ms (CUDA graph)",
    "drift_overhead_pct": "drift's overhead <= 10% of its time",
}
LIMITS = {"retrieval_bias_us": 20.0, "target_verify_ms": 3.5, "draft_step_ms": 0.35, "drift_overhead_pct": 10.0}


# ---- packing (this machine) ----------------------------------------------------------------------

def tree_bytes(root: Path) -> int:
    """What every device call sends besides its carry: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    total = 0
    for name in out.split(b"\0"):
        p = root / os.fsdecode(name)
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(args) -> None:
    """Split the large wheel into parts so that every call (the tree + one folder) stays under the
    carry limit: parts 1..n-1 each in .gpu/partK (stashed in /tmp there), the last part with the
    extra files in .gpu/run (the call that runs the checks)."""
    gpu, wheel = Path(args.gpu), Path(args.wheel)
    root = Path(args.root)
    tree = tree_bytes(root)
    budget = args.budget_mib * MIB - tree - MARGIN
    extra = sum(Path(f).stat().st_size for f in args.extra)
    size = wheel.stat().st_size
    if budget <= extra:
        sys.exit(f"gpu_check: the tree leaves {budget / MIB:.1f} MiB per call, not enough for the "
                 f"{extra / MIB:.1f} MiB the last call carries")
    n = max(1, math.ceil((size + extra) / budget))
    part = math.ceil(size / n)
    while part + extra > budget:                  # the last call also carries the extra files
        n += 1
        part = math.ceil(size / n)
    run = gpu / "run"
    folders = [gpu / f"part{i + 1}" for i in range(n - 1)] + [run]
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)
    with open(wheel, "rb") as src:
        for i, f in enumerate(folders):
            (f / f"{wheel.name}.part{i + 1:02d}").write_bytes(src.read(part))
    for f in args.extra:
        shutil.copy2(f, run / Path(f).name)
    manifest = {"wheel": wheel.name, "sha256": sha256(wheel), "parts": n, "part_bytes": part,
                "budget_bytes_per_call": budget, "tree_bytes": tree,
                "git": args.git, "prepared": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    calls = []
    for i, f in enumerate(folders[:-1]):
        calls.append({"command": f"mkdir -p {STASH} && cp {f.relative_to(root)}/* {STASH}/ && ls -l {STASH}",
                      "carry": [str(f.relative_to(root))], "timeout_s": 120})
    calls.append({"command": f"bash scripts/gpu-check.sh run --out $OUT --from {run.relative_to(root)}",
                  "carry": [str(run.relative_to(root))], "timeout_s": 600})
    (gpu / "calls.json").write_text(json.dumps(calls, indent=2) + "\n")
    print(f"{n} device calls, each within 30 s of the one before (the machine stays warm 30 s); "
          f"each carries at most {(part + extra) / MIB:.1f} MiB besides the {tree / MIB:.1f} MiB tree:")
    for i, c in enumerate(calls):
        print(f"  call {i + 1}: run(command={c['command']!r}, carry={c['carry']}, timeout_s={c['timeout_s']})")
    print(f"(the same calls as JSON: {gpu / 'calls.json'})")


def snapshot_scenarios(args) -> None:
    """Copy each scenario's current build (latest.json + its split directory) out of the cache,
    in the cache's layout, for DRIFT_DATA_SNAPSHOT=1 on a machine without the source files."""
    from drift_cli import scenarios
    from drift_cli.scenarios.build import cache_root

    dest = Path(args.dest) / "scenarios" / "splits"
    for name in args.names:
        for build in scenarios.build(name):          # a mixed scenario: each of its components
            part = build.scenario.name
            shutil.copytree(build.directory, dest / part / build.directory.name, dirs_exist_ok=True)
            shutil.copy2(cache_root() / "splits" / part / "latest.json", dest / part / "latest.json")
            print(f"scenario {part}: {build.directory}")


# ---- random-init Llama pairs (the GPU machine) -------------------------------------------------

SHAPES = {   # hidden, layers, intermediate, heads, kv heads, vocab
    "1b": (2048, 16, 8192, 32, 8, 128256),
    "8b": (4096, 32, 14336, 32, 8, 128256),
    "toy": (64, 2, 176, 4, 2, 512),
}
DRAFT_LAYERS = 2


def llama(args) -> None:
    """A random-init LlamaForCausalLM of a Llama-3 shape and its 2-layer draft (same family), saved
    as HF directories OUT/target and OUT/draft, with the micro zoo's tokenizer (the profile needs
    one; the ids it scores are random)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, inter, heads, kv, vocab = SHAPES[args.size]
    dtype = getattr(torch, args.dtype)
    tok = Path(__file__).resolve().parent.parent / "results" / "baselines" / "micro" / "tokenizer"
    for role, n in (("target", layers), ("draft", DRAFT_LAYERS)):
        cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=n, intermediate_size=inter, num_attention_heads=heads,
                          num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=4096,
                          rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        t0 = time.perf_counter()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)                      # initialised in its dtype, where it lives:
        try:                                                # 8B parameters never pass through fp32
            with torch.device(args.device):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(previous)
        out = Path(args.out) / role
        model.save_pretrained(out, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(tok / f, out / f)
        params = sum(p.numel() for p in model.parameters())
        print(f"{args.size} {role}: {params / 1e9:.2f} B parameters, {time.perf_counter() - t0:.1f} s -> {out}")
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


# ---- results (the GPU machine) -----------------------------------------------------------------

def junit(args) -> None:
    """Pass/fail counts of a pytest run from its JUnit XML."""
    import xml.etree.ElementTree as ET

    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    path = Path(args.xml)
    if path.is_file():
        root = ET.parse(path).getroot()
        for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
    out = {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
           "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
           "failed_tests": failed[:50], "files": args.files, "interpreter": args.interpreter == "1",
           "TRITON_ALLOW_NON_CONSTEXPR_GLOBALS": args.allow_globals or None, "xml_found": path.is_file()}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


def profiles(args) -> None:
    """Every `drift profile --out` JSON of the run in one file, keyed by its label (file stem)."""
    doc = {}
    for f in args.files:
        p = Path(f)
        if p.is_file():
            try:
                doc[p.stem] = json.loads(p.read_text())
            except json.JSONDecodeError as e:
                doc[p.stem] = {"error": f"not JSON: {e}"}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def bars(d: Path) -> dict[str, dict]:
    """Each bar: the measured value, the limit, and met (None where it was not measured)."""
    out = {k: {"bar": v, "value": None, "met": None} for k, v in BARS.items()}
    kt = _read(d / "kernel-tests.json")
    if kt and kt.get("xml_found"):
        ok = kt["failed"] == 0 and kt["errors"] == 0 and kt["passed"] > 0
        out["kernel_tests_pass"] |= {"value": f"{kt['passed']} passed, {kt['failed']} failed, {kt['errors']} errors",
                                     "met": ok and not kt["interpreter"] and not kt["TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"]}
    run = _read(d / "run.json")
    if run:
        rows = run.get("methods", {})
        bad = sorted(n for n, m in rows.items() if n != "ar" and (m.get("error") or m.get("ar_match_rate") != 1.0))
        out["main_job_complete"] |= {"value": f"complete {run.get('complete')}, {len(rows)} methods"
                                     + (f", not equal to ar or failed: {', '.join(bad)}" if bad else ""),
                                     "met": bool(run.get("complete")) and not bad}
        drift = rows.get("drift") or {}
        if drift.get("overhead_pct") is not None:
            out["drift_overhead_pct"] |= {"value": drift["overhead_pct"],
                                          "met": drift["overhead_pct"] <= LIMITS["drift_overhead_pct"]}
    kern = _read(d / "kernels.json")
    if kern and kern.get("rows"):
        us = [r["triton"]["us_per_draft_token"] for r in kern["rows"] if "triton" in r]
        shape = kern.get("shape", {})
        at_bar = (shape.get("N"), shape.get("d"), shape.get("m")) == (4096, 2048, 32)
        if us:
            out["retrieval_bias_us"] |= {"value": max(us), "met": at_bar and max(us) <= LIMITS["retrieval_bias_us"]}
    prof = (_read(d / "profiles.json") or {}).get("pair-graph") or {}
    if prof.get("verify_ms"):
        v = max(prof["verify_ms"][:4])
        out["target_verify_ms"] |= {"value": v, "met": v <= LIMITS["target_verify_ms"]}
    if prof.get("draft_ms_per_token") is not None:
        v = prof["draft_ms_per_token"]
        out["draft_step_ms"] |= {"value": v, "met": v <= LIMITS["draft_step_ms"]}
    return out


def _fmt(v) -> str:
    if v is None:
        return "unmeasured"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def summary(args) -> None:
    """summary.json and summary.md from the JSON the steps wrote (nothing typed in by hand)."""
    d = Path(args.dir)
    steps = [json.loads(line) for line in Path(args.state).read_text().splitlines() if line.strip()]
    manifest = _read(Path(args.manifest)) if args.manifest else None
    result = bars(d)
    doc = {"dry_run": args.dry_run, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "prepared": manifest, "steps": steps, "bars": result}
    (d / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# GPU check" + (" (dry run: the CPU at toy sizes; no figure below is a bar's condition)"
                              if args.dry_run else ""), "",
             f"{doc['date']}, {doc['machine']['gpu']}; python {doc['machine']['python']}, "
             f"torch {doc['machine']['torch']}, triton {doc['machine']['triton']}, "
             f"transformers {doc['machine']['transformers']}; tree {(manifest or {}).get('git', 'unknown')}", "",
             "| step | status | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in steps]
    lines += ["", "| bar | measured | met |", "| --- | --- | --- |"]
    lines += [f"| {b['bar']} | {_fmt(b['value'])} | {_fmt(b['met'])} |" for b in result.values()]
    (d / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def machine() -> dict:
    out = {"python": sys.version.split()[0], "gpu": "no GPU"}
    for mod in ("torch", "triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: recorded as such
            out[mod] = "absent"
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--gpu", required=True)
    p.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    p.add_argument("--wheel", required=True)
    p.add_argument("--extra", nargs="*", default=[])
    p.add_argument("--budget-mib", type=int, default=64)
    p.add_argument("--git", default="unknown")
    p = sub.add_parser("scenarios")
    p.add_argument("--dest", required=True)
    p.add_argument("names", nargs="+")
    p = sub.add_parser("llama")
    p.add_argument("--out", required=True)
    p.add_argument("--size", choices=list(SHAPES), required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p = sub.add_parser("junit")
    p.add_argument("--xml", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--interpreter", default="0")
    p.add_argument("--allow-globals", default="")
    p.add_argument("--files", nargs="*", default=[])
    p = sub.add_parser("profiles")
    p.add_argument("--out", required=True)
    p.add_argument("files", nargs="*")
    p = sub.add_parser("summary")
    p.add_argument("--dir", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--manifest", default=None)
    p.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    {"pack": pack, "scenarios": snapshot_scenarios, "llama": llama, "junit": junit, "profiles": profiles,
     "summary": summary}[args.cmd](args)


if __name__ == "__main__":
    main()
