"""Runs as rows to load (pandas, a spreadsheet): one row per run and method, every field a column.

`drift report RUN_DIR --format csv` writes the rows of saved runs; `drift suite export SUITE`
those of a suite's finished cells, in CSV (the stdlib `csv` module) or Parquet (pyarrow, the
optional `export` extra). A column is the dotted path of a field in run.json:

    suite, cell, axis.<axis>      a suite cell: its suite, key and point label on each axis
    method                        the row's method (`ar`, the baseline, included)
    config.<setting>              the run's settings; method flags under config.options.<flag>
    <metric>                      the method's block: acceptance_rate (α), speedup, stream.distinct_4, ...
    control.<metric>              the method's block on the indist control stream
    run.<field>                   the rest of run.json: run.scenario, run.stream.*, run.comparisons.*, ...

Nested tables are flattened with dots. A list (a histogram, a CI, a curve) is one column holding
its JSON text, so that nothing is dropped and every row has the same columns; an absent value is
empty (CSV) or null (Parquet).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterable

from drift_cli.errors import BadInput

FORMATS = ("csv", "parquet")
NOT_RUN_FIELDS = ("config", "methods", "control")   # in their own columns, not under run.


def _flatten(prefix: str, table: dict, row: dict[str, Any]) -> None:
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(f"{name}.", value, row)
        elif isinstance(value, (list, tuple)):
            row[name] = json.dumps(value)
        else:
            row[name] = value


def run_rows(run: dict, cell: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per method of a run.json; `cell`: the suite cell it is ({suite, key, coords})."""
    common: dict[str, Any] = {}
    if cell is not None:
        common |= {"suite": cell["suite"], "cell": cell["key"]}
        common |= {f"axis.{axis}": label for axis, label in cell["coords"].items()}
    common["method"] = None
    _flatten("config.", run.get("config", {}), common)
    rows = []
    for method, metrics in run["methods"].items():
        row = {**common, "method": method}
        _flatten("", metrics, row)
        _flatten("control.", (run.get("control") or {}).get(method) or {}, row)
        _flatten("run.", {k: v for k, v in run.items() if k not in NOT_RUN_FIELDS and k != "cell"}, row)
        rows.append(row)
    return rows


def _section(name: str) -> int:
    """Where a column goes: the row's identity, settings, metrics, control metrics, the rest of the run."""
    if name in ("suite", "cell", "method") or name.startswith("axis."):
        return 0
    return {"config": 1, "control": 3, "run": 4}.get(name.partition(".")[0], 2)


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every column of any row, by section, each section in the order its columns first appear."""
    return sorted(dict.fromkeys(name for row in rows for name in row), key=_section)


def _csv_line(fields: list[Any]) -> str:
    """One CSV record ending in "\\n". The writer runs with "\\r\\n" as its terminator, so that a
    field holding a carriage return, a newline, a quote or a comma is quoted (with "\\n" alone, a
    bare "\\r" in a label would be written unquoted and split the record on reading)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(fields)
    return buf.getvalue()[:-2] + "\n"


def csv_text(rows: list[dict[str, Any]]) -> str:
    """CSV with a header row; None is an empty field, a float keeps every digit (its repr). Reads
    back with Python's csv module and pandas to the same rows, whatever the labels hold."""
    names = columns(rows)
    return _csv_line(names) + "".join(_csv_line(["" if row.get(n) is None else row[n] for n in names])
                                      for row in rows)


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise BadInput("--format parquet needs pyarrow: pip install 'drift-bench[export]'") from None
    return pyarrow


def _arrow_column(pa, values: list) -> Any:
    """A typed column where the values share a type (ints and floats: float); else their text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    pa = _pyarrow()
    names = columns(rows)
    table = pa.table({n: _arrow_column(pa, [row.get(n) for row in rows]) for n in names})
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def encode(rows: list[dict[str, Any]], fmt: str) -> bytes:
    if fmt not in FORMATS:
        raise BadInput(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
    return csv_text(rows).encode() if fmt == "csv" else parquet_bytes(rows)


def write_rows(rows: list[dict[str, Any]], fmt: str, path: Path) -> Path:
    """The rows as one file, written atomically."""
    from drift_cli.atomic import atomic_write_bytes

    data = encode(rows, fmt)            # pyarrow missing: refused before anything is written
    atomic_write_bytes(Path(path), data)
    return Path(path)


def suite_rows(cells: Iterable[tuple[dict[str, Any], dict]]) -> list[dict[str, Any]]:
    """Rows of (cell, run.json) pairs, in the given order."""
    return [row for cell, run in cells for row in run_rows(run, cell)]
