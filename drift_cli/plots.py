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


def plot_run(run: dict, out_dir: Path) -> None:
    plot_alpha_curves(run, Path(out_dir) / "acceptance.png")
    plot_speedups(run, Path(out_dir) / "speedup.png")
