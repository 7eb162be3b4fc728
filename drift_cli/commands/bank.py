"""`drift bank inspect SNAPSHOT`: check a DRIFT bank snapshot and summarise it (registered by
drift_cli.cli). A snapshot that cannot be read or fails any check is bad input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from drift_cli.atomic import strict_json
from drift_cli.console import row_table
from drift_cli.errors import BadInput


def read_summary(path: Path) -> dict:
    """The checked summary of the snapshot at `path`; BadInput with one clear line otherwise."""
    try:
        from drift_cli import _bank
    except ImportError as e:  # the Rust extension is not built in this checkout
        raise BadInput(f"the Rust extension drift_cli._bank is not available ({e}); "
                       "build it with `maturin develop --release`") from None
    try:
        return _bank.read_snapshot_summary(str(path))
    except _bank.BankError as e:
        raise BadInput(f"bank snapshot {path}: {e}") from None
    except OSError as e:
        raise BadInput(f"bank snapshot {path}: {e.strerror or e}") from None


def _summary_table(s: dict) -> Table:
    table = Table(title=f"bank snapshot {s['path']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    dtypes = s["dtypes"]
    mib = 1024 * 1024
    rows = [
        ("format version", str(s["format_version"])),
        ("slots N / key dim d / support m", f"{s['N']} / {s['d']} / {s['m']}"),
        ("dtypes", f"keys {dtypes['keys']}, support {dtypes['support']}, bias {dtypes['bias']}, "
                   f"counts {dtypes['counts']}"),
        ("arrays", f"{s['array_bytes']} bytes ({s['array_bytes'] / mib:.2f} MiB)"),
        ("file", f"{s['file_bytes']} bytes (header {s['header_bytes']})"),
        ("used slots", f"{s['used']} of {s['N']}"),
        ("hits / allocations / evictions",
         f"{s['stats']['hits']} / {s['stats']['allocations']} / {s['stats']['evictions']}"),
        ("draft fingerprint", s["draft_fingerprint"]),
        ("checksum (sha256)", s["checksum"]),
        ("config", json.dumps(s["config"], sort_keys=True)),
    ]
    rows += [(f"meta {k}", v) for k, v in sorted(s["meta"].items())]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _tenant_table(tenants: dict) -> Table:
    table = row_table("tenants", ("tenant", "quota", "used", "hits", "allocations", "evictions"))
    for name, t in tenants.items():
        quota = "pool" if t["quota"] is None else str(t["quota"])
        table.add_row(name, quota, str(t["used"]), str(t["hits"]), str(t["allocations"]), str(t["evictions"]))
    return table


@click.group("bank")
def bank() -> None:
    """Inspect DRIFT bank snapshots."""


@bank.command("inspect")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (and nothing else).")
def inspect(snapshot: Path, as_json: bool) -> None:
    """Check SNAPSHOT (version, checksum, shapes, books) and print its summary."""
    summary = read_summary(snapshot)
    if as_json:
        click.echo(strict_json(summary, indent=2, sort_keys=True))
        return
    out = Console()
    out.print(_summary_table(summary))
    if summary["tenants"]:
        out.print(_tenant_table(summary["tenants"]))
