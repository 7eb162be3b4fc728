"""`drift claims index [--check]`: every claim of every claims report in one table, docs/claims.md
(logic in drift_cli/suite/claims_index.py).

Exit codes: 0 written (or, with --check, the file is what the command writes), 1 --check found
the file different, 2 bad input (a malformed record, a missing field, an unknown suite, an output
path that is one of the inputs).
"""

from __future__ import annotations

from pathlib import Path

import click

from drift_cli.console import err_console
from drift_cli.suite.claims_index import DEFAULT_INDEX, DEFAULT_RECORDS, DEFAULT_SUITES


@click.group()
def claims() -> None:
    """The claims index: every claim of the claims reports, one table."""


@claims.command()
@click.option("--records", "records_dir", type=click.Path(path_type=Path), default=DEFAULT_RECORDS, show_default=True,
              help="the folder of claim records (`drift suite report SUITE --claims` writes one beside each report)")
@click.option("--suites", "suites_dir", type=click.Path(path_type=Path), default=DEFAULT_SUITES, show_default=True,
              help="the suite files: a record's suite must be one, and a claim they declare without a record is "
                   "listed as not measured")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_INDEX, show_default=True,
              help="where the index goes")
@click.option("--check", is_flag=True, help="write nothing; exit 1 when OUT differs from what the command writes")
def index(records_dir: Path, suites_dir: Path, out: Path, check: bool) -> None:
    """Write docs/claims.md: one row per claim and source (number, claim, suite and cells, figure
    with its 95% CI, threshold, verdict), read from the claim records."""
    from drift_cli.atomic import atomic_write_bytes, check_output_target, refuse_inputs
    from drift_cli.errors import BadInput, CheckFailed
    from drift_cli.suite.claims_index import index_text

    if not suites_dir.is_dir():
        raise BadInput(f"--suites {suites_dir} is not a folder")
    inputs = [("the records folder", records_dir), ("the suites folder", suites_dir)]
    if records_dir.is_dir():
        inputs += [(f"the claim record {p.name}", p) for p in sorted(records_dir.glob("*.json"))]
    refuse_inputs(out, inputs, "--out")
    check_output_target(out, "--out")
    text, records = index_text(records_dir, suites_dir, out)
    rows = sum(1 for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit())
    what = f"{rows} rows from {len(records)} records"
    if check:
        try:
            have = out.read_text(encoding="utf-8") if out.exists() else None
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"cannot read --out {out}: {getattr(e, 'strerror', None) or e}") from None
        if have != text:
            why = "does not exist" if have is None else "differs from what `drift claims index` writes"
            raise CheckFailed(f"{out} {why} from {records_dir}: run `drift claims index` and commit it")
        err_console.print(f"{out} is up to date ({what})", highlight=False)
        return
    atomic_write_bytes(out, text.encode())
    err_console.print(f"→ {out} ({what})", highlight=False)
