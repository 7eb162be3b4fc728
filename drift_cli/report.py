"""Rich tables for runs, fresh or re-read from `run.json` (`drift report RUN_DIR...`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from drift_cli.errors import failure_line
from drift_cli.results import method_errors


def _f(x, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _gap(comparisons: dict, x: str) -> str:
    """A gap closed, or n/a when the run has offline and vanilla but no gap beyond their noise."""
    value = comparisons.get(f"gap_closed_{x}")
    return "n/a" if value is None else _f(value)


def _speedup(m: dict) -> str:
    if m.get("speedup") is None:
        return "–"
    lo, hi = m["speedup_ci95"]
    return f"{m['speedup']:.2f} [{lo:.2f}, {hi:.2f}]"


def method_table(title: str, methods: dict[str, dict]) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in [("method", "left"), ("α", "right"), ("τ", "right"), ("tok/s", "right"),
                      ("speedup [95% CI]", "right"), ("predicted i.i.d. / measured", "right"),
                      ("overhead %", "right"), ("p50 / p99 ms", "right"), ("ar match", "right"),
                      ("conv. steps", "right"), ("recovery steps", "right")]:
        t.add_column(col, justify=just)
    for name, m in methods.items():
        t.add_row(
            name,
            _f(m.get("acceptance_rate")),
            _f(m.get("mean_accepted_length"), "{:.2f}"),
            _f(m.get("tokens_per_s"), "{:.1f}"),
            _speedup(m),
            f"{_f(m.get('predicted_speedup'), '{:.2f}')} / {_f(m.get('predicted_speedup_measured'), '{:.2f}')}",
            _f(m.get("overhead_pct"), "{:.2f}"),
            f"{_f(m.get('p50_step_ms'), '{:.1f}')} / {_f(m.get('p99_step_ms'), '{:.1f}')}",
            _f(m.get("ar_match_rate"), "{:.2f}"),
            _f(m.get("convergence_steps"), "{}"),
            _f((m.get("target_change") or {}).get("recovery_steps"), "{}"),
        )
    return t


def source_table(methods: dict[str, dict]) -> Table | None:
    """A multi-source method's (`hybrid`) steps by source: share, α and τ beside its totals
    (metrics.by_source); None when no method has sources."""
    rows = [(name, m, m["by_source"]) for name, m in methods.items() if m.get("by_source")]
    if not rows:
        return None
    t = Table(title="sources (per step, which source proposed)", title_justify="left")
    for col in ("method", "source", "share of steps", "α", "τ", "choosing % of iteration"):
        t.add_column(col, justify="left" if col in ("method", "source") else "right")
    for name, m, by in rows:
        for source, s in by["sources"].items():
            t.add_row(name, source, _f(s.get("share"), "{:.1%}"), _f(s.get("acceptance_rate")),
                      _f(s.get("mean_accepted_length"), "{:.2f}"), "")
        t.add_row(name, "all", "100.0%", _f(m.get("acceptance_rate")), _f(m.get("mean_accepted_length"), "{:.2f}"),
                  _f(by.get("choose_pct"), "{:.2f}"))
    return t


def second_thread_table(methods: dict[str, dict]) -> Table | None:
    """Methods with work on a second thread (osd --osd-async's worker, --background-load): its
    CPU seconds beside the decoding thread's time, so that compute moved off the decode path is
    not read as compute saved; None when no method has any."""
    rows = [(name, m, m.get("report") or {}) for name, m in methods.items()
            if "worker_seconds" in (m.get("report") or {}) or "background_load" in (m.get("report") or {})]
    if not rows:
        return None
    t = Table(title="second thread (background training or load)", title_justify="left")
    for col in ("method", "updates", "swaps", "staleness mean", "second thread CPU s", "decode s"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for name, m, r in rows:
        cpu = r["worker_seconds"] if "worker_seconds" in r else r["background_load"]["seconds"]
        t.add_row(name, _f(r.get("updates"), "{}"), _f(r.get("swaps"), "{}"), _f(r.get("staleness_mean"), "{:.2f}"),
                  _f(cpu, "{:.2f}"), _f(m.get("decode_seconds"), "{:.2f}"))
    return t


def batch_curve_table(curve: dict) -> Table:
    """--batch-sizes: one row per (batch size, method)."""
    t = Table(title="batch-size curve (speedup and throughput vs ar at the same B)", title_justify="left")
    for col in ("B", "method", "α", "τ", "speedup [95% CI]", "throughput tok/s", "vs ar", "overhead %",
                "harness %", "latency p50 / p99 ms"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in curve["rows"]:
        t.add_row(str(r["batch_size"]), r["method"], _f(r.get("acceptance_rate")),
                  _f(r.get("mean_accepted_length"), "{:.2f}"), _speedup(r),
                  _f(r.get("throughput_tokens_per_s"), "{:.1f}"), _f(r.get("throughput_speedup"), "{:.2f}"),
                  _f(r.get("overhead_pct"), "{:.2f}"), _f(r.get("harness_overhead_pct"), "{:.1f}"),
                  f"{_f(r.get('latency_ms_p50'), '{:.0f}')} / {_f(r.get('latency_ms_p99'), '{:.0f}')}")
    return t


def render_run(run: dict, console: Console, path: str | None = None) -> None:
    status = "" if run.get("complete", True) else " [bold red](INCOMPLETE)[/]"
    head = f"[bold]{run['scenario']}[/] ({run['split']}), γ={run['config'].get('gamma')}, T={run['config'].get('temperature')}"
    console.print(head + status + (f"  → {path}" if path else ""))
    console.print(method_table("methods", run["methods"]))
    sources = source_table(run["methods"])
    if sources is not None:
        console.print(sources)
    second = second_thread_table(run["methods"])
    if second is not None:
        console.print(second)
    if run.get("control"):
        console.print(method_table("indist control", run["control"]))
    s = run.get("stream", {})
    console.print(
        f"stream: {s.get('prompts')} prompts, {s.get('output_tokens')} output tokens, "
        f"repeated 4-gram share {_f(s.get('repeated_ngram_share'))}, distinct-4 {_f(s.get('distinct_4'))}"
    )
    c = run.get("comparisons", {})
    console.print(
        f"gap closed (α) {_gap(c, 'alpha')}, gap closed (speedup) {_gap(c, 'speedup')}, "
        f"shift penalty {_f(c.get('shift_penalty'))}"
    )
    for name, m in run["methods"].items():
        for d in m.get("ar_divergence") or []:
            console.print(f"[yellow]{name} left ar's output[/] on prompt {d['prompt']} at token {d['position']} "
                          f"({d['token']} for {d['ar_token']}); the target's top-2 logit gap there: {_f(d['top2_gap'], '{:.2e}')}")
    if run.get("batch_curve"):
        console.print(batch_curve_table(run["batch_curve"]))
    skipped = run.get("config", {}).get("methods_skipped") or {}
    for name, why in skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
    for name, error in method_errors(run).items():
        console.print(Text(failure_line(name, error), style="red"))
