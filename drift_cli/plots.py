"""PNG plots of a run: acceptance over verification steps, and speedup bars with 95% CIs."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from drift_cli.atomic import atomic_write_bytes  # noqa: E402


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Render a figure to PNG and write it atomically; closes the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


def plot_alpha_curves(run: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, m in run["methods"].items():
        curve = m.get("alpha_curve") or []
        if curve:
            ax.plot([s for s, _ in curve], [a for _, a in curve], label=name)
    ax.set_xlabel("verification step")
    ax.set_ylabel("acceptance rate (windowed)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{run['scenario']} ({run['split']}): acceptance over the stream")
    if ax.get_legend_handles_labels()[1]:   # an interrupted run may have no drafting method yet
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_speedups(run: dict, path: Path) -> None:
    names = [n for n, m in run["methods"].items() if m.get("speedup") is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    vals = [run["methods"][n]["speedup"] for n in names]
    lo = [v - run["methods"][n]["speedup_ci95"][0] for n, v in zip(names, vals, strict=True)]
    hi = [run["methods"][n]["speedup_ci95"][1] - v for n, v in zip(names, vals, strict=True)]
    ax.bar(names, vals, yerr=[lo, hi], capsize=4, color="#4c72b0")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("speedup vs ar (per-prompt mean, 95% CI)")
    ax.set_title(f"{run['scenario']} ({run['split']})")
    fig.tight_layout()
    save_figure(fig, path)


def plot_batch_curve(run: dict, path: Path) -> None:
    """Speedup vs ar at the same B, throughput and α against the batch size, one line per method."""
    rows = run["batch_curve"]["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for key, ax, label in (("speedup", axes[0], "speedup vs ar at the same B"),
                           ("throughput_tokens_per_s", axes[1], "throughput (tokens/s, whole stream)"),
                           ("acceptance_rate", axes[2], "acceptance rate α")):
        for i, m in enumerate(methods):      # one colour per method in every panel (ar has no α)
            pts = [(r["batch_size"], r[key]) for r in rows if r["method"] == m and r[key] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m, color=f"C{i}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel(label)
        if key == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].legend()
    fig.suptitle(f"{run['scenario']} ({run['split']}): the batch-size curve")
    fig.tight_layout()
    save_figure(fig, path)


def plot_run(run: dict, out_dir: Path) -> None:
    plot_alpha_curves(run, Path(out_dir) / "acceptance.png")
    plot_speedups(run, Path(out_dir) / "speedup.png")
    if run.get("batch_curve"):
        plot_batch_curve(run, Path(out_dir) / "batch-curve.png")
