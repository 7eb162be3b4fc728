"""`drift claims index`: every claim of every claims report in one table (docs/claims.md).

Each claims report (`drift suite report SUITE --claims`) leaves its claim record beside it,
`claims-records/<report stem>.json` (`claims.claim_record`). The index reads every record of one
folder, checks each field (a malformed record, a missing field or a suite the suites folder does
not hold is one `BadInput` line), and writes one row per claim and source: a report's column (a
zoo, a drafter, a decoding). A claim measured in several reports has a row for each, in the order
of the records' file names; its parts are lines of one row. A claim that a suite declares and no
record holds gets one "not measured" row per declaring suite, with the reason. The text depends on
the records and the suite files only (no dates, no paths outside the repository), so CI can check
that the committed docs/claims.md is what the command writes (`--check`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drift_cli.errors import BadInput
from drift_cli.suite.claims import (RECORD_VERSION, SIDES, VERDICTS, Claim, _fmt, gain_note, parse_claims,
                                    side_text)
from drift_cli.suite.spec import QUICK_SUFFIX

DEFAULT_RECORDS = Path("docs/claims-records")
DEFAULT_SUITES = Path("suites")
DEFAULT_INDEX = Path("docs/claims.md")
WORDS = {"confirmed": "holds", "refuted": "fails", "inconclusive": "inconclusive", "not measured": "not measured"}
DERIVED = ("cells", "markdown")        # a record built by the report from its cells, or read back from its markdown


@dataclass(frozen=True)
class Record:
    path: Path
    data: dict


# --- reading and checking the records ----------------------------------------------------------

def _get(obj: Any, key: str, kind: type | tuple, where: str, none: bool = False) -> Any:
    if not isinstance(obj, dict):
        raise BadInput(f"{where} is {type(obj).__name__}, not an object")
    if key not in obj:
        raise BadInput(f"{where} has no field '{key}'")
    v = obj[key]
    if v is None and none:
        return v
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
    if ok and isinstance(v, float) and not math.isfinite(v):
        ok = False
    if not ok:
        want = "/".join(k.__name__ for k in kinds) + (" or null" if none else "")
        raise BadInput(f"{where}.{key} is {type(v).__name__} {v!r:.40}, expected {want}")
    return v


def _strings(obj: dict, key: str, where: str) -> list[str]:
    v = _get(obj, key, list, where)
    if not all(isinstance(x, str) for x in v):
        raise BadInput(f"{where}.{key} must be a list of strings")
    return v


def _check_measured(m: Any, where: str) -> None:
    _get(m, "mean", (int, float), where, none=True)
    ci = _get(m, "ci", list, where, none=True)
    if ci is not None and not (len(ci) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    and math.isfinite(x) for x in ci)):
        raise BadInput(f"{where}.ci must be [low, high] or null, got {ci!r:.60}")
    _get(m, "n", int, where)
    if _get(m, "verdict", str, where) not in VERDICTS:
        raise BadInput(f"{where}.verdict '{m['verdict']}' is not one of: {', '.join(VERDICTS)}")
    _get(m, "reason", str, where)
    _strings(m, "cells", where)


def _check_claim(c: Any, columns: list[str], where: str) -> None:
    _get(c, "id", int, where)
    for key in ("title", "quote", "source", "pending"):
        _get(c, key, str, where)
    _get(c, "gain", bool, where)
    parts = _get(c, "parts", list, where)
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        _get(p, "label", str, w)
        _get(p, "figure", str, w)
        if _get(p, "side", str, w) not in SIDES:
            raise BadInput(f"{w}.side '{p['side']}' is not one of: {', '.join(SIDES)}")
        _get(p, "threshold", (int, float), w)
        for k, op in enumerate(_get(p, "operands", list, w)):
            _get(op, "name", str, f"{w}.operands[{k}]")
            _get(op, "metric", str, f"{w}.operands[{k}]")
            wh = _get(op, "where", dict, f"{w}.operands[{k}]")
            if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in wh.values()):
                raise BadInput(f"{w}.operands[{k}].where must map each axis to a list of labels")
    per = _get(c, "columns", dict, where)
    if sorted(per) != sorted(columns):
        raise BadInput(f"{where}.columns has {sorted(per)}, the record's columns are {columns}")
    for col in columns:
        w = f"{where}.columns[{col!r}]"
        r = per[col]
        if _get(r, "verdict", str, w) not in VERDICTS:
            raise BadInput(f"{w}.verdict '{r['verdict']}' is not one of: {', '.join(VERDICTS)}")
        cp = _get(r, "copying", dict, w, none=True)
        if cp is not None:
            _get(cp, "rivals", bool, f"{w}.copying", none=True)
            _get(cp, "text", str, f"{w}.copying")
        ms = _get(r, "parts", list, w)
        if len(ms) != len(parts):
            raise BadInput(f"{w}.parts has {len(ms)} entries for the claim's {len(parts)} parts")
        for j, m in enumerate(ms):
            _check_measured(m, f"{w}.parts[{j}]")


def check_record(data: Any, where: str, suites: Path) -> None:
    """BadInput (one line, naming the file and the field) unless `data` is a claim record whose
    suite is a suite file of `suites`."""
    if not isinstance(data, dict):
        raise BadInput(f"{where} is not a claim record (a JSON object)")
    version = _get(data, "record", int, where)
    if version != RECORD_VERSION:
        raise BadInput(f"{where}: record version {version}, expected {RECORD_VERSION}")
    name = _get(data, "suite", str, where)
    quick = _get(data, "quick", bool, where)
    base = name[: -len(QUICK_SUFFIX)] if quick and name.endswith(QUICK_SUFFIX) else name
    if not base or "/" in base or not (suites / f"{base}.toml").is_file():
        known = sorted(p.stem for p in suites.glob("*.toml"))
        raise BadInput(f"{where}: unknown suite '{name}' (no {suites / (base + '.toml')}); the suites: {', '.join(known)}")
    for key in ("suite_file", "report", "selection"):
        _get(data, key, str, where)
    report = data["report"]
    if not report.endswith(".md") or Path(report).name != report:
        raise BadInput(f"{where}.report must be the report's file name (NAME.md), got {report!r:.60}")
    if _get(data, "derived_from", str, where) not in DERIVED:
        raise BadInput(f"{where}.derived_from '{data['derived_from']}' is not one of: {', '.join(DERIVED)}")
    _strings(data, "column_settings", where)
    _strings(data, "repeat", where)
    columns = _strings(data, "columns", where)
    claims = _get(data, "claims", list, where)
    seen = set()
    for i, c in enumerate(claims):
        _check_claim(c, columns, f"{where}: claims[{i}]")
        if c["id"] in seen:
            raise BadInput(f"{where}: claim {c['id']} appears twice")
        seen.add(c["id"])


def load_records(records: Path, suites: Path) -> list[Record]:
    """Every `*.json` of the records folder, checked, in file-name order."""
    import json

    if not records.is_dir():
        raise BadInput(f"no claim records: {records} is not a folder (`drift suite report SUITE --claims` writes them)")
    paths = sorted(records.glob("*.json"))
    if not paths:
        raise BadInput(f"no claim records in {records} (`drift suite report SUITE --claims` writes them)")
    out = []
    for p in paths:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadInput(f"{p} is not a claim record (not valid JSON: {e})") from None
        except OSError as e:
            raise BadInput(f"cannot read {p}: {e.strerror or e}") from None
        check_record(data, str(p), suites)
        out.append(Record(p, data))
    return out


def catalogue(suites: Path) -> dict[int, list[tuple[Path, Claim]]]:
    """claim id -> (suite file, claim) for every suite of the folder that declares claims."""
    from drift_cli.scenarios.schema import read_toml

    out: dict[int, list[tuple[Path, Claim]]] = {}
    for p in sorted(suites.glob("*.toml")):
        raw = read_toml(p)
        if "claim" not in raw:
            continue
        for c in parse_claims(raw, p).claims:     # named as from the folder above (suites/x.toml): the same text anywhere
            out.setdefault(c.id, []).append((Path(suites.resolve().name) / p.name, c))
    return out


# --- the index ---------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cells_text(parts: list[dict]) -> str:
    """The points a claim's parts read, axis by axis: `experiment: indist, code; zoo: ...`."""
    axes: dict[str, list[str]] = {}
    for p in parts:
        for op in p["operands"]:
            for axis, labels in op["where"].items():
                have = axes.setdefault(axis, [])
                have += [x for x in labels if x not in have]
    return "; ".join(f"{a}: {', '.join(v)}" for a, v in axes.items())


def _tag(label: str) -> str:
    """A part label's leading `(a) `, to mark its threshold's line."""
    head = label.split(" ", 1)[0]
    return f"{head} " if len(head) <= 4 and head.startswith("(") and head.endswith(")") else ""


def _figure(m: dict) -> str:
    if m["mean"] is None:
        return f"not measured: {m['reason']}" if m["reason"] else "not measured"
    ci = f" [{_fmt(m['ci'][0])}, {_fmt(m['ci'][1])}]" if m["ci"] else " (one repeat, no CI)"
    return f"{_fmt(m['mean'])}{ci}, n = {m['n']} → {WORDS[m['verdict']]}"


def _rel(target: Path, out: Path) -> str:
    return Path(os.path.relpath(target.resolve(), out.resolve().parent)).as_posix()


def _command(rec: dict) -> str:
    q = " --quick" if rec["quick"] else ""
    sel = f" {rec['selection']}" if rec["selection"] else ""
    return f"drift suite report {rec['suite_file']}{q}{sel} --claims"


def render_index(records: list[Record], cat: dict[int, list[tuple[Path, Claim]]], out: Path,
                 records_dir: Path) -> str:
    rows: dict[int, list[list[str]]] = {}
    titles: dict[int, str] = {}
    for r in records:
        rec = r.data
        link = f"`{rec['suite']}` ([{rec['report']}]({_rel(r.path.parent.parent / rec['report'], out)}))"
        for c in rec["claims"]:
            for col in rec["columns"]:
                res = c["columns"][col]
                where = f"{link} · {col}" + (f"<br>{_cells_text(c['parts'])}" if c["parts"] else "")
                if c["parts"]:
                    figs = "<br>".join(f"{p['label']}: {_figure(m)}" for p, m in zip(c["parts"], res["parts"]))
                    thresholds = "<br>".join(_tag(p["label"]) + side_text(p["side"], p["threshold"])
                                             for p in c["parts"])
                else:
                    figs, thresholds = f"not measured: {c['pending']}", "–"
                verdict = f"**{WORDS[res['verdict']]}**"
                rivals = res["copying"]["rivals"] if res["copying"] else None
                if note := gain_note(c["gain"], rivals, res["verdict"]):
                    verdict += f"; {note}"
                title = c["title"] if titles.get(c["id"]) != c["title"] else "″"     # as the row above
                titles[c["id"]] = c["title"]
                rows.setdefault(c["id"], []).append([str(c["id"]), title, where, figs, thresholds, verdict])
    for cid, declared in cat.items():
        if cid in rows:
            continue
        for path, claim in declared:
            thresholds = "<br>".join(_tag(p.label) + side_text(p.side, p.threshold) for p in claim.parts) or "–"
            reason = claim.pending or (f"no committed claims report measures it yet; "
                                       f"`drift suite run {path.as_posix()} --claim {cid} --jobs 2 && "
                                       f"drift suite report {path.as_posix()} --claims`")
            title = claim.title if titles.get(cid) != claim.title else "″"
            titles[cid] = claim.title
            rows.setdefault(cid, []).append([str(cid), title, f"`{path.stem}` (`{path.as_posix()}`)",
                                             f"not measured: {reason}", thresholds, "**not measured**"])
    reports = []
    for r in records:
        rec = r.data
        how = ("read back from its markdown: its cells' run.json files are not committed"
               if rec["derived_from"] == "markdown" else "from its cells")
        cols = ", ".join(f"`{c}`" for c in rec["columns"])
        reports.append(f"- [{rec['report']}]({_rel(r.path.parent.parent / rec['report'], out)}): suite "
                       f"`{rec['suite']}`, claims {', '.join(str(c['id']) for c in rec['claims'])}; columns "
                       f"({' / '.join(rec['column_settings'])}) {cols}; `{_command(rec)}` "
                       f"(record: {r.path.name}, {how})")
    lines = [
        "# The claims, measured",
        "",
        f"Every claim, one row per source: a column (a zoo, a drafter, a decoding) of a claims report. "
        f"Written by `drift claims index` from the claim records in `{_rel(records_dir, out)}/`, which "
        "`drift suite report SUITE --claims` writes beside each report; CI checks it with "
        "`drift claims index --check`. Do not edit it by hand.",
        "",
        "**Verdicts.** A part *holds* when its figure's 95% CI (Student-t, over the repeats) lies wholly on the "
        "claim's side of the threshold and *fails* when it lies wholly on the other side (the reports' confirmed "
        "and refuted); a claim holds when every "
        "part holds, fails when any part fails, and is otherwise inconclusive, or not measured when no part has a "
        "figure. The rule in full, the copying control beside each DRIFT claim, the commands that re-run each "
        "claim's cells and the plots: the reports.",
        "",
        *reports,
        "",
        "| # | claim | suite · column, cells | figure [95% CI], n repeats | threshold | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for cid in sorted(rows):
        for row in rows[cid]:
            lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(lines) + "\n"


def index_text(records_dir: Path, suites: Path, out: Path) -> tuple[str, list[Record]]:
    records = load_records(records_dir, suites)
    return render_index(records, catalogue(suites), out, records_dir), records
