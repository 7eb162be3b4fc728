"""`drift suite report`: a suite's finished cells as one markdown report with PNGs.

One row per combination of the suite's axes other than the repeats (`seed`, `shuffle`: another
sampling seed, another draw of the stream); per method α / τ / speedup, the stream's repeated
4-gram share and the comparisons, each figure read from the cells' run.json. Where a row has
several repeats the figure is their mean ± the 95% CI half-width (Student t,
`metrics.seed_mean_ci95`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from drift_cli import metrics
from drift_cli.atomic import atomic_write_bytes
from drift_cli.results import RunJson
from drift_cli.suite import store
from drift_cli.suite.spec import Suite

SEED_AXIS = "seed"
REPEAT_AXES = (SEED_AXIS, "shuffle")     # a row's cells differ only in these: its figures are their mean
FIGURES = (("α", "acceptance_rate", "{:.3f}"), ("τ", "mean_accepted_length", "{:.2f}"), ("speedup", "speedup", "{:.2f}"))


def figure(values: list, fmt: str) -> str:
    """One figure of a row: the value, or mean ± CI half-width over its seeds; '–' when absent."""
    xs = [v for v in values if v is not None]
    if not xs:
        return "–"
    mean, ci = metrics.seed_mean_ci95(xs)
    return fmt.format(mean) if ci is None else f"{fmt.format(mean)} ± {fmt.format(ci[1] - mean)}"


def row_axes(suite: Suite) -> list[str]:
    """The axes that tell rows apart: those with more than one value, the repeats left out."""
    return [a for a in suite.axes if a not in REPEAT_AXES and len({c.coord(a) for c in suite.cells}) > 1]


def rows(suite: Suite, runs: dict[str, RunJson]) -> list[tuple[tuple[str, ...], list[RunJson]]]:
    """(row coordinates, the finished runs of its cells) in suite order."""
    axes = row_axes(suite)
    out: dict[tuple[str, ...], list[RunJson]] = {}
    for c in suite.cells:
        label = tuple(c.coord(a) or "" for a in axes)
        out.setdefault(label, [])
        if c.key in runs:
            out[label].append(runs[c.key])
    return list(out.items())


def method_names(runs: list[RunJson]) -> list[str]:
    names: dict[str, None] = {}
    for r in runs:
        names.update(dict.fromkeys(n for n in r["methods"] if n != "ar"))
    return list(names)


def results_table(suite: Suite, runs: dict[str, RunJson]) -> str:
    axes = row_axes(suite)
    methods = method_names(list(runs.values()))
    seeds = any(a in suite.axes for a in REPEAT_AXES)
    head = [*axes, *[f"{m} α / τ / speedup" for m in methods], "repeated 4-gram share", "gap closed α / speedup",
            "shift penalty", *(["repeats"] if seeds else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, group in rows(suite, runs):
        cells = list(label)
        for m in methods:
            cells.append(" / ".join(figure([r["methods"].get(m, {}).get(k) for r in group], fmt) for _, k, fmt in FIGURES))
        comp = lambda k: [r.get("comparisons", {}).get(k) for r in group]  # noqa: E731
        cells += [figure([r.get("stream", {}).get("repeated_ngram_share") for r in group], "{:.2f}"),
                  f"{figure(comp('gap_closed_alpha'), '{:.2f}')} / {figure(comp('gap_closed_speedup'), '{:.2f}')}",
                  figure(comp("shift_penalty"), "{:.2f}")]
        if seeds:
            cells.append(str(len(group)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source_text(group: list[RunJson], method: str) -> str | None:
    """A multi-source method's sources in one row: 'source share α / τ' each, mean ± CI over the
    row's repeats; None when the method has no sources here."""
    names: dict[str, None] = {}
    for r in group:
        names.update(dict.fromkeys((r["methods"].get(method, {}).get("by_source") or {}).get("sources", {})))
    if not names:
        return None

    def get(r, name, key):
        return ((r["methods"][method].get("by_source") or {}).get("sources", {}).get(name) or {}).get(key)
    return "; ".join(f"{name} {figure([get(r, name, 'share') for r in group], '{:.2f}')} of steps, "
                     + " / ".join(figure([get(r, name, k) for r in group], fmt) for _, k, fmt in FIGURES[:2])
                     for name in names)


def sources_table(suite: Suite, runs: dict[str, RunJson]) -> str | None:
    """Per row, each multi-source method's (`hybrid`) share of steps and α / τ per source."""
    axes = row_axes(suite)
    lines = []
    for label, group in rows(suite, runs):
        for m in method_names(group):
            text = source_text(group, m)
            if text is not None:
                lines.append("| " + " | ".join([*label, m, text]) + " |")
    if not lines:
        return None
    head = [*axes, "method", "per source: share of steps, α / τ"]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines])


def _plot(suite: Suite, runs: dict[str, RunJson], key: str, ylabel: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    from drift_cli.plots import save_figure

    groups = rows(suite, runs)
    methods = method_names(list(runs.values()))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(methods)) / 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        means, errs = [], []
        for _, group in groups:
            xs = [r["methods"].get(m, {}).get(key) for r in group]
            xs = [x for x in xs if x is not None]
            mean, ci = metrics.seed_mean_ci95(xs) if xs else (float("nan"), None)
            means.append(mean)
            errs.append(0.0 if ci is None else ci[1] - mean)
        ax.bar([j + i * width for j in range(len(groups))], means, width=width, yerr=errs, capsize=3, label=m)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [", ".join(g) or suite.name for g, _ in groups],
                  rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)


def pinning(manifest: dict) -> str:
    threads = manifest.get("threads") or [1]
    jobs = manifest.get("jobs", 1)
    ex = manifest.get("executor", "local")
    many = "Ray tasks each holding that many CPUs" if ex == "ray" else f"at most {jobs} cells at once"
    plural = "" if threads == [1] else "s"
    return (f"Thread pinning: every cell ran with {'/'.join(map(str, threads))} torch CPU thread{plural} (the `threads` "
            f"setting). The last run (`suite.json`): executor `{ex}`, `--jobs {jobs}`, {many}, on a machine with "
            f"{os.cpu_count()} cores; a suite's cells may come from several runs, and nothing here records what ran "
            f"beside an earlier one.")


def write_report(suite: Suite, root: Path, out: Path) -> Path:
    """report.md (and acceptance.png, speedup.png) in `out`; returns the report's path."""
    states = store.status(root, suite)
    runs = store.finished_runs(root, suite)
    manifest = json.loads((root / "suite.json").read_text()) if (root / "suite.json").is_file() else {}
    counts = {s: sum(1 for v in states.values() if v == s) for s in store.STATES}
    lines = [f"# Suite `{suite.name}`", ""]
    if suite.description:
        lines += [suite.description, ""]
    lines += [f"{len(suite.cells)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f" (in `{root}`).", "",
              pinning(manifest), "",
              "Each figure is read from its cell's run.json (`<scenario>/<cell key>/run.json`); where a row has "
              "several repeats (seeds, stream shuffles) it is their mean ± the 95% CI half-width (Student t).", ""]
    if runs:
        lines += [results_table(suite, runs), ""]
        sources = sources_table(suite, runs)
        if sources is not None:
            lines += ["Which source proposed each step (`hybrid`):", "", sources, ""]
        lines += ["![acceptance](acceptance.png)", "", "![speedup](speedup.png)", ""]
        _plot(suite, runs, "acceptance_rate", "acceptance rate α", out / "acceptance.png")
        _plot(suite, runs, "speedup", "speedup vs ar", out / "speedup.png")
    lines += ["## Cells", "", "| key | " + " | ".join(suite.axes) + " | state |", "|" + "---|" * (len(suite.axes) + 2)]
    for c in suite.cells:
        err = store.failure(root, c.key) if states[c.key] == "failed" else None
        lines.append(f"| {c.key} | " + " | ".join(c.coord(a) or "" for a in suite.axes)
                     + f" | {states[c.key]}{f': {err}' if err else ''} |")
    path = Path(out) / "report.md"
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return path

