"""Markdown tables from saved runs, for the README and docs/results.md.

    python benchmarks/results_table.py results/*/*/run.json [--methods vanilla,drift,...]

One row per (scenario, temperature): per method α / τ / speedup, plus the stream's repeated
4-gram share, and the comparisons (gap closed, shift penalty). Later runs of the same
(scenario, temperature) replace earlier ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drift_cli.bench import comparisons

DEFAULT_METHODS = "vanilla,drift,offline,osd,pld,suffix"


def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def load_runs(paths: list[str]) -> dict[tuple[str, float], dict]:
    runs: dict[tuple[str, float], dict] = {}
    for p in sorted(paths, key=lambda p: json.loads(Path(p).read_text()).get("run_id", "")):
        run = json.loads(Path(p).read_text())
        if run.get("complete"):
            runs[(run["scenario"], run["config"]["temperature"])] = run
    return runs


def table(runs: dict[tuple[str, float], dict], methods: list[str]) -> str:
    head = ["scenario", "T"] + [f"{m} α / τ / speedup" for m in methods] + ["repeated 4-gram share", "gap closed α / speedup", "shift penalty"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (scenario, temp), run in sorted(runs.items()):
        cells = [scenario, f"{temp:g}"]
        for m in methods:
            r = run["methods"].get(m)
            cells.append("–" if r is None else
                         f"{_f(r['acceptance_rate'], '{:.3f}')} / {_f(r['mean_accepted_length'])} / {_f(r['speedup'])}")
        c = comparisons(run["methods"], run.get("control") or None)  # today's formulas on saved metrics
        cells += [_f(run.get("stream", {}).get("repeated_ngram_share")),
                  f"{_f(c.get('gap_closed_alpha'))} / {_f(c.get('gap_closed_speedup'))}", _f(c.get("shift_penalty"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    args = ap.parse_args()
    print(table(load_runs(args.runs), args.methods.split(",")))


if __name__ == "__main__":
    main()
