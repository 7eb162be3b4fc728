"""Do two sets of bench runs propose the same drafts? (a check, not a benchmark)

Pairs the run directories under two roots by their path relative to the root with the run id
dropped (`<root>/<label>/<scenario>/<run-id>/run.json`), then compares exactly, per method:
acceptance rate α, mean accepted length τ, the drafted and accepted token totals, the accept
length histogram, and every step record of steps.jsonl (scope, method, prompt, step, drafted,
accepted, emitted). Timings are not compared. Exits 1 on any difference (listed), 2 when a run
is missing on either side, 0 when everything agrees.

    drift bench --zoo micro --scenario code --methods all --max-prompts 4 --max-new-tokens 32 --out A/code
    ... the same with the changed code into B ...
    python benchmarks/compare_runs.py A B
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXACT = ("acceptance_rate", "mean_accepted_length", "drafted_tokens", "accepted_tokens", "iterations",
         "accept_length_histogram")
STEP_KEYS = ("scope", "method", "prompt", "step", "drafted", "accepted", "emitted")


def runs(root: Path) -> dict[str, Path]:
    """{<label>/<scenario>: run dir} for every run.json under root."""
    return {str(p.parent.parent.relative_to(root)): p.parent for p in sorted(root.rglob("run.json"))}


def method_figures(run: dict) -> dict[str, dict]:
    out = {}
    for scope in ("methods", "control"):
        for name, m in (run.get(scope) or {}).items():      # control: the indist stream's methods
            out[f"{scope}/{name}"] = {k: m.get(k) for k in EXACT}
    return out


def steps(run_dir: Path) -> list[tuple]:
    with open(run_dir / "steps.jsonl") as f:
        return [tuple(json.loads(line).get(k) for k in STEP_KEYS) for line in f if line.strip()]


def compare(a: Path, b: Path) -> list[str]:
    """Differences between two run directories (empty: they agree)."""
    diffs = []
    ra, rb = (json.loads((d / "run.json").read_text()) for d in (a, b))
    fa, fb = method_figures(ra), method_figures(rb)
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) != fb.get(name):
            diffs.append(f"{name}: {fa.get(name)} != {fb.get(name)}")
    sa, sb = steps(a), steps(b)
    if len(sa) != len(sb):
        diffs.append(f"steps.jsonl: {len(sa)} records != {len(sb)}")
    for x, y in zip(sa, sb):
        if x != y:
            diffs.append(f"first differing step: {dict(zip(STEP_KEYS, x))} != {dict(zip(STEP_KEYS, y))}")
            break
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    ra, rb = runs(args.before), runs(args.after)
    missing = sorted(set(ra) ^ set(rb))
    if missing or not ra:
        print(f"runs on one side only: {missing or 'no runs found'}", file=sys.stderr)
        return 2
    bad = 0
    for key in sorted(ra):
        diffs = compare(ra[key], rb[key])
        n = len(steps(ra[key]))
        print(f"{key}: {'identical' if not diffs else 'DIFFERENT'} ({n} step records)")
        for d in diffs:
            print(f"    {d}")
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
