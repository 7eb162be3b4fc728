"""The claim records of claims reports whose cells are not committed, read back from their markdown.

`drift suite report SUITE --claims` writes a report's record beside it (claims-records/<stem>.json)
from the results it renders. The committed reports were measured on the real pair before records
existed, and their cells' run.json files are not in the repository, so their records are read back
from the markdown, which `claims.render` wrote: the table row of each claim (its figures, CIs,
verdicts and copying control per column) and the "Notes per claim" section (each part's label,
figure, threshold and operands). The figures keep the report's printed precision (3 decimals, or
none at 100 and above); the parts' cell keys are not printed, so they are empty. A record built
this way says so (`"derived_from": "markdown"`).

    python scripts/claims_records_from_md.py docs/claims-seeds.md docs/claims-eagle.md ...

writes docs/claims-records/<stem>.json for each, and fails (exit 2, one line) on a report it
cannot read back whole.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from drift_cli.atomic import atomic_write_bytes, strict_json
from drift_cli.errors import BadInput
from drift_cli.scenarios.schema import read_toml
from drift_cli.suite.claims import RECORD_VERSION, VERDICTS, parse_claims, record_path
from drift_cli.suite.spec import QUICK_SUFFIX

SIDE = re.compile(r"^(?:(>|<) |(within|outside) ±)(-?[0-9.e+-]+)$")
RUN_LINE = re.compile(r"^drift suite run (\S+)( --quick)?(.*?) --jobs \d+ && drift suite report \S+(?: --quick)?.* --claims$")
NOTE_CLAIM = re.compile(r"^- \*\*(\d+)\.\*\* ")
NOTE_PART = re.compile(r"^  - (.*): figure `(.*)` (> \S+|< \S+|within ±\S+|outside ±\S+), where (.*)\.$")
OPERAND = re.compile(r"`(\w+)` = `([^`]+)` on (.*?)(?=; `\w+` = `|$)")
FIGURE = re.compile(r"^(–|-?[0-9.]+)(?: \[(-?[0-9.]+), (-?[0-9.]+)\]| \(one repeat, no CI\)), n = (\d+)$")
GAIN = "DRIFT's gain cannot be told apart from copying here"


def _num(text: str) -> float | None:
    return None if text == "–" else float(text)


def _side(text: str) -> tuple[str, float]:
    m = SIDE.match(text)
    if not m:
        raise BadInput(f"threshold {text!r} is not > t, < t, within ±t or outside ±t")
    side = {">": "above", "<": "below"}.get(m[1] or "", m[2] or "")
    return side, float(m[3])


def _where(text: str) -> dict[str, list[str]]:
    out = {}
    for item in text.split(", "):
        axis, _, labels = item.partition("=")
        out[axis] = labels.split("|")
    return out


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def _notes(lines: list[str]) -> dict[int, list[dict]]:
    """claim id -> its parts, from the "Notes per claim" section."""
    start = lines.index("## Notes per claim")
    parts: dict[int, list[dict]] = {}
    cid = None
    for line in lines[start + 1:]:
        if m := NOTE_CLAIM.match(line):
            cid = int(m[1])
            parts[cid] = []
        elif line.startswith("  - ") and cid is not None:
            m = NOTE_PART.match(line)
            if not m:
                raise BadInput(f"claim {cid}: cannot read the part line {line[:80]!r}")
            side, t = _side(m[3])
            ops = [{"name": o[1], "metric": o[2], "where": _where(o[3])} for o in OPERAND.finditer(m[4])]
            if not ops:
                raise BadInput(f"claim {cid}: no operands in {line[:80]!r}")
            parts[cid].append({"label": m[1], "figure": m[2], "side": side, "threshold": t, "operands": ops})
    return parts


def _measured(text: str, where: str) -> tuple[dict, str]:
    """One part's figure line after its label: the measured part, and the claim's pending text if it ends with one."""
    fig, sep, rest = text.rpartition(" → ")
    if not sep:
        raise BadInput(f"{where}: no verdict in {text[:80]!r}")
    verdict = next((v for v in VERDICTS if rest == v or rest.startswith(v + " (")), None)
    if verdict is None:
        raise BadInput(f"{where}: unknown verdict in {rest[:60]!r}")
    pending = rest[len(verdict) + 2:-1] if rest != verdict else ""
    if fig.startswith("not measured yet: "):
        return {"mean": None, "ci": None, "n": 0, "verdict": verdict, "reason": fig[len("not measured yet: "):],
                "cells": []}, pending
    m = FIGURE.match(fig)
    if not m:
        raise BadInput(f"{where}: cannot read the figure {fig[:80]!r}")
    ci = [float(m[2]), float(m[3])] if m[2] is not None else None
    return {"mean": _num(m[1]), "ci": ci, "n": int(m[4]), "verdict": verdict, "reason": "", "cells": []}, pending


def _copying(cell: str, columns: list[str]) -> dict[str, dict]:
    out = {}
    for line in cell.split("<br>"):
        col = next((c for c in columns if line.startswith(f"{c}: ")), None)
        if col is None:
            raise BadInput(f"copying control line {line[:60]!r} names no column")
        text = line[len(col) + 2:]
        rivals = True if "copying alone reaches DRIFT's speedup here" in text else \
            False if "DRIFT's speedup is above copying's" in text else None
        out[col] = {"rivals": rivals, "text": text}
    return out


def record_from_markdown(md: Path) -> dict:
    lines = md.read_text(encoding="utf-8").splitlines()
    run = next((RUN_LINE.match(x) for x in lines if x.startswith("drift suite run ")), None)
    if not run:
        raise BadInput(f"{md}: no regenerate line (`drift suite run ... && drift suite report ... --claims`)")
    suite_file, quick, selection = Path(run[1]), bool(run[2]), run[3].strip()
    declared = {c.id: c for c in parse_claims(read_toml(suite_file), suite_file).claims}
    header = next(x for x in lines if x.startswith("| # | claim (seed) |"))
    columns = [c[: -len(": figure [95% CI], verdict")] for c in _split_row(header)[2:-3]]
    settings = re.match(r"^Columns: the (.*?) settings? \(", next(x for x in lines if x.startswith("Columns: the ")))
    repeat = re.search(r"Repeats \(the units of every CI\): (.*?)\. ", next(x for x in lines if x.startswith("Columns: ")))
    parts_of = _notes(lines)
    claims = []
    for line in lines:
        if not re.match(r"^\| \d+ \|", line):
            continue
        cells = _split_row(line)
        cid = int(cells[0])
        where = f"{md}: claim {cid}"
        m = re.match(r"^\*\*(.*)\*\*<br>“(.*)” \(\*(.*)\*\)$", cells[1])
        if not m:
            raise BadInput(f"{where}: cannot read the claim cell")
        title, quote, source = m[1], m[2], m[3]
        parts = parts_of.get(cid)
        if parts is None:
            raise BadInput(f"{where}: no notes")
        copying = _copying(cells[2 + len(columns)], columns) if cells[2 + len(columns)] != "(not a DRIFT row)" else None
        per, pending, gain_seen = {}, "", False
        for col, cell in zip(columns, cells[2:2 + len(columns)]):
            bits = cell.split("<br>")
            vm = re.match(r"^\*\*verdict: (.*?)(; .*)?\*\*$", bits[-1])
            if not vm or vm[1] not in VERDICTS:
                raise BadInput(f"{where}, {col}: cannot read the verdict {bits[-1][:60]!r}")
            gain_seen |= bool(vm[2] and GAIN in vm[2])
            measured = []
            if not parts:
                if not bits[0].startswith("not measured yet: "):
                    raise BadInput(f"{where}, {col}: a claim without parts must say why")
                pending = bits[0][len("not measured yet: "):]
            else:
                if len(bits) - 1 != len(parts):
                    raise BadInput(f"{where}, {col}: {len(bits) - 1} figure lines for {len(parts)} parts")
                for p, bit in zip(parts, bits):
                    head = f"{p['label']} ({_side_text(p)}): "
                    if not bit.startswith(head):
                        raise BadInput(f"{where}, {col}: figure line {bit[:60]!r} is not part {p['label']!r}")
                    m_, pend = _measured(bit[len(head):], f"{where}, {col}")
                    pending = pending or pend
                    measured.append(m_)
            per[col] = {"verdict": vm[1], "copying": copying[col] if copying else None, "parts": measured}
        gain = declared[cid].gain if cid in declared else gain_seen
        if gain_seen and not gain:
            raise BadInput(f"{where}: its verdict speaks of DRIFT's gain, but the suite's claim {cid} has no gain = true")
        claims.append({"id": cid, "title": title, "quote": quote, "source": source, "gain": gain, "pending": pending,
                       "parts": parts, "columns": per})
    if not claims:
        raise BadInput(f"{md}: no claim rows")
    name = suite_file.stem + (QUICK_SUFFIX if quick else "")
    return {"record": RECORD_VERSION, "suite": name, "suite_file": suite_file.as_posix(), "report": md.name,
            "quick": quick, "selection": selection, "derived_from": "markdown",
            "column_settings": re.findall(r"`([^`]+)`", settings[1]) if settings else [],
            "repeat": re.findall(r"`([^`]+)`", repeat[1]) if repeat else [], "columns": columns, "claims": claims}


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"


def rerender(rec: dict) -> dict[int, list[str]]:
    """The figure and copying cells of each claim row, written back from the record as claims.render
    writes them: the read-back is checked against the markdown it came from."""
    out = {}
    for c in rec["claims"]:
        cells = []
        for col in rec["columns"]:
            r = c["columns"][col]
            if not c["parts"]:
                cells.append(f"not measured yet: {c['pending']}<br>**verdict: not measured**")
                continue
            bits = []
            for p, m in zip(c["parts"], r["parts"]):
                if m["mean"] is None:
                    fig = f"not measured yet: {m['reason']}"
                else:
                    ci = f" [{_fmt(m['ci'][0])}, {_fmt(m['ci'][1])}]" if m["ci"] else " (one repeat, no CI)"
                    fig = f"{_fmt(m['mean'])}{ci}, n = {m['n']}"
                line = f"{p['label']} ({_side_text(p)}): {fig} → {m['verdict']}"
                if m["mean"] is None and c["pending"]:
                    line += f" ({c['pending']})"
                bits.append(line)
            v = r["verdict"]
            if c["gain"] and r["copying"] and r["copying"]["rivals"] and v != "not measured":
                v += f"; {GAIN}"
            cells.append("<br>".join(bits) + f"<br>**verdict: {v}**")
        copying = [c["columns"][col]["copying"] for col in rec["columns"]]
        cells.append("<br>".join(f"{col}: {cp['text']}" for col, cp in zip(rec["columns"], copying))
                     if copying[0] is not None else "(not a DRIFT row)")
        out[c["id"]] = cells
    return out


def check_read_back(md: Path, rec: dict) -> None:
    rows = {int(cells[0]): cells for line in md.read_text(encoding="utf-8").splitlines()
            if re.match(r"^\| \d+ \|", line) for cells in [_split_row(line)]}
    n = len(rec["columns"])
    for cid, cells in rerender(rec).items():
        if rows[cid][2:3 + n] != cells:
            raise BadInput(f"{md}: claim {cid} does not read back to the same row")


def _side_text(p: dict) -> str:
    t = p["threshold"]
    return {"above": f"> {t:g}", "below": f"< {t:g}", "within": f"within ±{t:g}", "outside": f"outside ±{t:g}"}[p["side"]]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    for arg in argv:
        md = Path(arg)
        try:
            rec = record_from_markdown(md)
            check_read_back(md, rec)
            atomic_write_bytes(record_path(md), (strict_json(rec, indent=1) + "\n").encode())
        except BadInput as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{md} → {record_path(md)} ({len(rec['claims'])} claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
