"""`drift suite report SUITE --claims`: the seeds' claims, each measured from a suite's cells,
with a 95% CI and a verdict by one rule (VERDICT_RULE), written as one markdown file with PNGs.

The claims are data, in the suite file:

    [claims]                       # how the report reads the cells
    columns = "zoo"                # one column of figures per value of this setting (or a list of
                                   # settings: a column per combination, "smollm / eagle")
    repeat = ["shuffle", "seed"]   # the axes whose values are independent repeats (default: these)
    out = "docs/claims-seeds.md"    # default: docs/claims-<suite file's stem>.md

    [[claim]]
    id = 3
    title = "DRIFT's overhead is under 3% of a decode step"
    seed = "000_fee7b5e6130b3396.txt"
    quote = "The overhead was 0.4 milliseconds per step, under 3 percent of a decode step."
    copying = { experiment = "code" }          # DRIFT rows: pld / suffix / 4-gram share beside them
    pending = "..."                            # said when no cell of the suite can measure it
    [[claim.part]]
    label = "drift overhead, % of a step"
    figure = "a"                               # arithmetic over the operands, per repeat
    a = { where = { experiment = "code" }, metric = "methods.drift.overhead_pct" }
    side = "below"                             # above | below | within | outside
    threshold = 3.0

Per repeat (the cells sharing their `repeat` coordinates, in one column), each operand is the
mean of its metric over the finished cells its `where` selects; the part's figure is computed
from the operands, and its mean and Student-t 95% CI over the repeats come from
`metrics.seed_mean_ci95`, as in `drift suite report`.

Beside the markdown, the report writes its claim record, `<report's folder>/claims-records/<report's
stem>.json` (`claim_record`): every claim, part and column with its figure, CI, threshold and
verdict, built from the same results the markdown is rendered from. `drift claims index` reads the
records into one table of every claim (drift_cli/suite/claims_index.py).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drift_cli import metrics
from drift_cli.atomic import atomic_write_bytes, strict_json
from drift_cli.errors import BadInput
from drift_cli.registry import unknown
from drift_cli.results import RunJson
from drift_cli.suite import store
from drift_cli.suite.report import pinning
from drift_cli.suite.spec import Cell, Suite, _label

SIDES = ("above", "below", "within", "outside")
VERDICTS = ("confirmed", "refuted", "inconclusive", "not measured")
DEFAULT_REPEAT = ("shuffle", "seed")
# The source documents a claim's `seed` names, by title (the report cites the title, not a file)
SOURCES = {"000_fee7b5e6130b3396.txt": "Speculative Decoding Under Distribution Shift: DRIFT Recalibration",
           "004_43ee447c85fbbb1f.txt": "Draft-Model Distillation for Speculative Decoding"}
DEFAULT_OUT = "docs/claims-{stem}.md"           # [claims] out when the suite gives none
RECORDS_DIR = "claims-records"                   # beside the report: RECORDS_DIR/<report stem>.json
RECORD_VERSION = 1
CLAIMS_KEYS = ("columns", "repeat", "out")          # the keys of [claims]

VERDICT_RULE = """\
**The verdict rule.** Each claim is tested as one or more *parts*. A part names a figure (a
metric of the suite's cells, or arithmetic over several, computed per repeat: one stream
shuffle or seed), a threshold, and the side of it the claim asserts. Its figure is the mean
over the repeats with a Student-t 95% confidence interval (CI) across them. A part is

- **confirmed** when the whole CI lies on the claim's side of the threshold (`above`: the CI's
  low end is above it; `below`: the high end is below it; `within ±t`: the CI lies inside
  (-t, t); `outside ±t`: the CI lies entirely above t or entirely below -t);
- **refuted** when the whole CI lies on the other side (`above`: the high end is below the
  threshold; `below`: the low end is above it; `within ±t`: the CI lies entirely outside
  [-t, t]; `outside ±t`: the CI lies inside (-t, t));
- **inconclusive** otherwise, including when only one repeat finished (no CI);
- **not measured** when no repeat has every figure the part needs (its cells are not in the
  suite, have not run, or the metric does not exist at this stream length); the reason is given.

A claim is confirmed when all its parts are, refuted when any part is, not measured when no part
was measured, and inconclusive otherwise. Beside every DRIFT claim stands the copying control:
`pld` and `suffix` (model-free copying) and the stream's repeated 4-gram share, on the cells the
claim names. Where copying alone reaches DRIFT's speedup (the upper end of the better copying
method's speedup CI is at least the lower end of DRIFT's), DRIFT's gain and copying cannot be told
apart there, and the verdict of a claim about DRIFT's gain says so. The thresholds are the claims' own numbers where a claim
names one, and otherwise stated with the part. Nothing here was tuned on these (test) streams:
every default was fixed on dev streams before (docs/drift.md)."""


@dataclass(frozen=True)
class Operand:
    where: dict[str, list[str]]
    metric: str


@dataclass(frozen=True)
class Part:
    label: str
    figure: str
    operands: dict[str, Operand]
    side: str
    threshold: float


@dataclass(frozen=True)
class Claim:
    id: int
    title: str
    seed: str
    quote: str
    parts: tuple[Part, ...]
    copying: dict[str, list[str]] | None = None
    pending: str = ""
    note: str = ""
    curve: dict | None = None      # {where, methods}: windowed α over steps, plotted beside the claim
    gain: bool = False             # the claim is about DRIFT's gain: its verdict says when copying rivals it


@dataclass(frozen=True)
class ClaimsSpec:
    columns: str | tuple[str, ...]     # the setting (or settings) whose values are the report's columns
    repeat: tuple[str, ...]
    out: Path
    claims: tuple[Claim, ...]


# --- the figure expression: + - * / and numbers, names, abs/min/max; nothing else ---------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_FUNCS = {"abs": abs, "min": min, "max": max}


_ARITY = {"abs": (1, 1), "min": (2, None), "max": (2, None)}    # (fewest, most) arguments


def _check_expr(node: ast.AST, names: set[str], where: str) -> None:
    ok = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Constant, ast.Name, ast.Load, ast.Call,
          *_BINOPS)
    for n in ast.walk(node):
        if not isinstance(n, ok):
            raise BadInput(f"{where}: figure may use + - * /, numbers, operand names and abs/min/max only")
        if isinstance(n, ast.Name) and n.id not in names and n.id not in _FUNCS:
            raise unknown(f"operand in {where}'s figure", n.id, sorted(names))
        if isinstance(n, ast.Constant) and (isinstance(n.value, bool) or not isinstance(n.value, (int, float))):
            raise BadInput(f"{where}: figure constant {n.value!r} is not a real number")
        if isinstance(n, ast.Call):
            if not (isinstance(n.func, ast.Name) and n.func.id in _FUNCS):
                raise BadInput(f"{where}: figure may call abs, min and max only")
            lo, hi = _ARITY[n.func.id]
            if n.keywords or len(n.args) < lo or (hi is not None and len(n.args) > hi):
                takes = f"{lo}" if lo == hi else f"{lo} or more"
                raise BadInput(f"{where}: figure calls {n.func.id}() with {len(n.args)} argument(s); it takes {takes}")


def evaluate(expr: str, values: dict[str, float]) -> float | None:
    """The figure from its operands' values; None when it divides by zero."""
    def ev(n: ast.AST) -> float:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return float(n.value)
        if isinstance(n, ast.Name):
            return values[n.id]
        if isinstance(n, ast.UnaryOp):
            return -ev(n.operand) if isinstance(n.op, ast.USub) else ev(n.operand)
        if isinstance(n, ast.BinOp):
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        assert isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        return _FUNCS[n.func.id](*[ev(a) for a in n.args])
    try:
        return float(ev(ast.parse(expr, mode="eval")))
    except ZeroDivisionError:
        return None


# --- parsing -------------------------------------------------------------------------------------

def _where(value: Any, where: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise BadInput(f"{where}: where must be a table of axis = label (or [labels])")
    return {k: [_label(x) for x in (v if isinstance(v, list) else [v])] for k, v in value.items()}


def _need(t: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in t:
        raise BadInput(f"{where}: {key} is required")
    if not isinstance(t[key], kind) or isinstance(t[key], bool) and kind is not bool:
        raise BadInput(f"{where}: {key} has the wrong type ({type(t[key]).__name__})")
    return t[key]


def _part(t: dict, where: str) -> Part:
    if not isinstance(t, dict):
        raise BadInput(f"{where} must be a table")
    operands = {}
    for name, v in t.items():
        if name in ("label", "figure", "side", "threshold"):
            continue
        if not (isinstance(v, dict) and set(v) == {"where", "metric"} and isinstance(v["metric"], str)):
            raise BadInput(f"{where}: operand {name} must be {{ where = {{...}}, metric = \"path.in.run.json\" }}")
        operands[name] = Operand(_where(v["where"], f"{where} {name}"), v["metric"])
    if not operands:
        raise BadInput(f"{where}: a part needs at least one operand")
    side = _need(t, "side", str, where)
    if side not in SIDES:
        raise unknown(f"side in {where}", side, SIDES)
    figure = str(t.get("figure", next(iter(operands))))
    try:
        tree = ast.parse(figure, mode="eval")
    except SyntaxError:
        raise BadInput(f"{where}: figure {figure!r} is not an expression") from None
    _check_expr(tree, set(operands), where)
    threshold = float(_need(t, "threshold", (int, float), where))
    if not math.isfinite(threshold):
        raise BadInput(f"{where}: threshold must be a finite number, got {threshold}")
    if side in ("within", "outside") and threshold < 0:
        raise BadInput(f"{where}: a {side} threshold is a half-width, >= 0")
    return Part(str(t.get("label", figure)), figure, operands, side, threshold)


def parse_claims(raw: dict, path: Path) -> ClaimsSpec:
    conf = raw.get("claims", {})
    if not isinstance(conf, dict):
        raise BadInput(f"{path}: [claims] must be a table")
    entries = raw.get("claim")
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"{path} declares no [[claim]] tables: it has no claims to report")
    claims, seen = [], set()
    for i, t in enumerate(entries):
        where = f"[[claim]] #{i + 1}"
        cid = _need(t, "id", int, where)
        where = f"claim {cid}"
        if cid in seen:
            raise BadInput(f"{path}: claim id {cid} is declared twice")
        seen.add(cid)
        parts = t.get("part", [])
        if not isinstance(parts, list):
            raise BadInput(f"{where}: part must be [[claim.part]] tables")
        curve = t.get("curve")
        if curve is not None:
            if not (isinstance(curve, dict) and "where" in curve and isinstance(curve.get("methods"), list)):
                raise BadInput(f"{where}: curve must be {{ where = {{...}}, methods = [...] }}")
            curve = {"where": _where(curve["where"], f"{where} curve"), "methods": [str(m) for m in curve["methods"]]}
        if not parts and not t.get("pending"):
            raise BadInput(f"{where}: a claim without parts must say why (pending = \"...\")")
        claims.append(Claim(cid, str(_need(t, "title", str, where)), str(_need(t, "seed", str, where)),
                            str(_need(t, "quote", str, where)),
                            tuple(_part(p, f"{where} part {j + 1}") for j, p in enumerate(parts)),
                            _where(t["copying"], f"{where} copying") if "copying" in t else None,
                            str(t.get("pending", "")), str(t.get("note", "")), curve, bool(t.get("gain", False))))
    extra = sorted(set(conf) - set(CLAIMS_KEYS))
    if extra:
        raise unknown(f"key in {path}'s [claims]", extra[0], CLAIMS_KEYS)
    repeat = conf.get("repeat", list(DEFAULT_REPEAT))
    if isinstance(repeat, str):
        repeat = [repeat]
    if not (isinstance(repeat, list) and all(isinstance(a, str) for a in repeat)):
        raise BadInput(f"{path}: [claims] repeat must be an axis name or a list of them, got {repeat!r}")
    columns = conf.get("columns", "zoo")
    if not (isinstance(columns, str) or (isinstance(columns, list) and columns and all(isinstance(c, str) for c in columns))):
        raise BadInput(f"{path}: [claims] columns must be a setting name or a list of them")
    columns = columns if isinstance(columns, str) else tuple(columns)
    out = conf.get("out", DEFAULT_OUT.format(stem=path.stem))
    if not isinstance(out, str) or not out:
        raise BadInput(f"{path}: [claims] out must be a file path, got {out!r}")
    return ClaimsSpec(columns, tuple(repeat), Path(out), tuple(claims))


def load_claims(suite: Suite) -> ClaimsSpec:
    """The suite's claims, with [claims] repeat and columns checked against its axes and settings."""
    from drift_cli.scenarios.schema import read_toml

    raw = read_toml(suite.path)
    spec = parse_claims(raw, suite.path)
    conf = raw.get("claims", {})
    for axis in spec.repeat if "repeat" in conf else ():
        if axis not in suite.axes:
            raise unknown(f"axis in {suite.path}'s [claims] repeat", axis, suite.axes)
    if "columns" in conf:
        known = _setting_names(suite)
        for name in (spec.columns,) if isinstance(spec.columns, str) else spec.columns:
            if name not in known:
                raise unknown(f"setting in {suite.path}'s [claims] columns", name, sorted(known))
    return spec


def _setting_names(suite: Suite) -> set[str]:
    """What a column may name: an axis, a setting of the cells or a method flag's option name."""
    from dataclasses import fields

    from drift_cli.bench_config import BenchConfig
    from drift_cli.suite.spec import _method_knobs

    return set(suite.axes) | {f.name for f in fields(BenchConfig)} | set(_method_knobs()) \
        | {k for c in suite.cells for k in cell_labels(suite, c)}


# --- reading the cells ---------------------------------------------------------------------------

def cell_labels(suite: Suite, cell: Cell) -> dict[str, str]:
    """A cell's label on every axis, and on every plain setting (so `where` may name either)."""
    out = {k: _label(v) for k, v in cell.settings.items() if not isinstance(v, dict)}
    out.update({k: _label(v) for k, v in cell.settings.get("options", {}).items()})
    out.update({a: cell.coord(a) or "" for a in suite.axes})
    return out


def matches(where: dict[str, list[str]], labels: dict[str, str]) -> bool:
    return all(labels.get(axis) in wanted for axis, wanted in where.items())


def read_metric(run: RunJson, path: str) -> float | None:
    """A number at a dotted path of run.json (`methods.drift.acceptance_rate`,
    `methods.drift.acceptance_by_entropy.4.acceptance_rate`); None where absent."""
    node: Any = run
    for part in path.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


@dataclass
class Measured:
    """One part (or a copying figure) in one column."""

    values: list[float] = field(default_factory=list)     # one per repeat
    mean: float | None = None
    ci: tuple[float, float] | None = None
    verdict: str = "not measured"
    reason: str = ""
    cells: list[str] = field(default_factory=list)         # keys of the cells it reads


def verdict(ci: tuple[float, float] | None, side: str, threshold: float) -> str:
    """The rule of VERDICT_RULE for one part's CI."""
    if ci is None:
        return "inconclusive"
    lo, hi = ci
    t = threshold
    if side == "above":
        return "confirmed" if lo > t else "refuted" if hi < t else "inconclusive"
    if side == "below":
        return "confirmed" if hi < t else "refuted" if lo > t else "inconclusive"
    inside = -t < lo and hi < t
    outside = lo > t or hi < -t
    if side == "within":
        return "confirmed" if inside else "refuted" if outside else "inconclusive"
    return "confirmed" if outside else "refuted" if inside else "inconclusive"


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its parts'."""
    if not verdicts or all(v == "not measured" for v in verdicts):
        return "not measured"
    if "refuted" in verdicts:
        return "refuted"
    if all(v == "confirmed" for v in verdicts):
        return "confirmed"
    return "inconclusive"


Column = list[tuple[Cell, dict[str, str], RunJson | None]]   # (cell, its labels, its run if done)


def _repeats(column: Column, where: dict[str, list[str]], metric: str, repeat: tuple[str, ...]
             ) -> tuple[dict[tuple, float], list[str], int]:
    """repeat coordinates -> the metric's mean over the selected finished cells; the selected cell keys;
    how many of them are done."""
    by: dict[tuple, list[float]] = {}
    keys, done = [], 0
    for cell, labels, run in column:
        if not matches(where, labels):
            continue
        keys.append(cell.key)
        if run is None:
            continue
        done += 1
        x = read_metric(run, metric)
        if x is not None:
            by.setdefault(tuple(labels.get(a, "") for a in repeat), []).append(x)
    return {r: sum(xs) / len(xs) for r, xs in by.items()}, keys, done


def _where_text(where: dict[str, list[str]]) -> str:
    return ", ".join(f"{k}={'|'.join(v)}" for k, v in where.items())


def measure(part: Part, column: Column, repeat: tuple[str, ...]) -> Measured:
    m = Measured()
    per: dict[str, dict[tuple, float]] = {}
    for name, op in part.operands.items():
        vals, keys, done = _repeats(column, op.where, op.metric, repeat)
        m.cells += [k for k in keys if k not in m.cells]
        if not keys:
            m.reason = f"no cell of the suite matches {_where_text(op.where)}"
        elif not done:
            m.reason = f"its {len(keys)} cell(s) ({_where_text(op.where)}) have not run"
        elif not vals:
            m.reason = f"`{op.metric}` is absent from its {done} finished cell(s) ({_where_text(op.where)})"
        per[name] = vals
        if m.reason:
            return m
    common = set.intersection(*[set(v) for v in per.values()])
    for r in sorted(common):
        x = evaluate(part.figure, {name: per[name][r] for name in per})
        if x is not None:
            m.values.append(x)
    if not m.values:
        m.reason = "no repeat has every operand (or the figure divides by zero)"
        return m
    m.mean, m.ci = metrics.seed_mean_ci95(m.values)
    m.verdict = verdict(m.ci, part.side, part.threshold)
    return m


COPYING = (("pld α", "methods.pld.acceptance_rate"), ("pld speedup", "methods.pld.speedup"),
           ("suffix α", "methods.suffix.acceptance_rate"), ("suffix speedup", "methods.suffix.speedup"),
           ("drift speedup", "methods.drift.speedup"), ("4-gram share", "stream.repeated_ngram_share"))


def copying_control(claim: Claim, column: Column, repeat: tuple[str, ...]) -> dict[str, Measured]:
    out = {}
    for label, metric in COPYING:
        part = Part(label, "x", {"x": Operand(claim.copying or {}, metric)}, "above", 0.0)
        out[label] = measure(part, column, repeat)
    return out


def copying_rivals(ctrl: dict[str, Measured]) -> bool | None:
    """Does copying alone reach DRIFT's speedup (CIs overlap or copying is ahead)? None: not measured."""
    drift = ctrl["drift speedup"]
    if drift.mean is None:
        return None
    best = None
    for name in ("pld speedup", "suffix speedup"):
        c = ctrl[name]
        if c.mean is not None and (best is None or c.mean > best.mean):
            best = c
    if best is None:
        return None
    hi = best.ci[1] if best.ci else best.mean
    lo = drift.ci[0] if drift.ci else drift.mean
    return hi >= lo


# --- the report ----------------------------------------------------------------------------------

@dataclass
class ClaimResult:
    claim: Claim
    parts: dict[str, list[Measured]]         # column -> one per part
    verdicts: dict[str, str]                 # column -> the claim's verdict
    copying: dict[str, dict[str, Measured]]  # column -> the copying control
    rivals: dict[str, bool | None]


def column_label(spec: ClaimsSpec, labels: dict[str, str]) -> str:
    """A cell's column: its value of the column setting, or its values of several joined by ' / '."""
    names = (spec.columns,) if isinstance(spec.columns, str) else spec.columns
    return " / ".join(labels.get(n, "") for n in names)


def columns_text(spec: ClaimsSpec) -> str:
    names = (spec.columns,) if isinstance(spec.columns, str) else spec.columns
    return " / ".join(f"`{n}`" for n in names) + (" setting" if len(names) == 1 else " settings")


def columns_of(suite: Suite, spec: ClaimsSpec, runs: dict[str, RunJson]) -> dict[str, Column]:
    cols: dict[str, Column] = {}
    for c in suite.cells:
        labels = cell_labels(suite, c)
        cols.setdefault(column_label(spec, labels), []).append((c, labels, runs.get(c.key)))
    return cols


def assess(suite: Suite, spec: ClaimsSpec, runs: dict[str, RunJson]) -> tuple[list[str], list[ClaimResult]]:
    cols = columns_of(suite, spec, runs)
    repeat = tuple(a for a in spec.repeat)
    results = []
    for claim in spec.claims:
        parts = {col: [measure(p, column, repeat) for p in claim.parts] for col, column in cols.items()}
        copying = {col: copying_control(claim, column, repeat) for col, column in cols.items()} if claim.copying else {}
        results.append(ClaimResult(claim, parts, {col: combine([m.verdict for m in ms]) for col, ms in parts.items()},
                                   copying, {col: copying_rivals(c) for col, c in copying.items()}))
    return list(cols), results


def claim_cells(suite: Suite, spec: ClaimsSpec, claim_id: int) -> list[Cell]:
    """The cells a claim reads (its parts, its copying control, its curve), in suite order."""
    claim = next((c for c in spec.claims if c.id == claim_id), None)
    if claim is None:
        raise unknown("claim", str(claim_id), [str(c.id) for c in spec.claims])
    wheres = [op.where for p in claim.parts for op in p.operands.values()]
    wheres += [claim.copying] if claim.copying else []
    wheres += [claim.curve["where"]] if claim.curve else []
    cells = [c for c in suite.cells if any(matches(w, cell_labels(suite, c)) for w in wheres)]
    if not cells:
        raise BadInput(f"claim {claim_id} reads no cell of suite {suite.name}" + (f": {claim.pending}" if claim.pending else ""))
    return cells


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"


def figure_text(m: Measured) -> str:
    if m.mean is None:
        return f"not measured yet: {m.reason}"
    ci = f" [{_fmt(m.ci[0])}, {_fmt(m.ci[1])}]" if m.ci else " (one repeat, no CI)"
    return f"{_fmt(m.mean)}{ci}, n = {len(m.values)}"


def side_text(side: str, t: float) -> str:
    return {"above": f"> {t:g}", "below": f"< {t:g}", "within": f"within ±{t:g}", "outside": f"outside ±{t:g}"}[side]


def _side_text(p: Part) -> str:
    return side_text(p.side, p.threshold)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _copying_text(ctrl: dict[str, Measured], rivals: bool | None) -> str:
    if all(m.mean is None for m in ctrl.values()):
        return "not measured yet"
    parts = [f"{k} {_fmt(m.mean)}" + (f" ± {_fmt(m.ci[1] - m.mean)}" if m.ci and m.mean is not None else "")
             for k, m in ctrl.items() if k != "drift speedup"]
    if rivals:
        parts.append("**copying alone reaches DRIFT's speedup here: DRIFT's gain and copying cannot be told apart**")
    elif rivals is False:
        parts.append("DRIFT's speedup is above copying's")
    return "; ".join(parts)


def reproduce(suite: Suite, claim: Claim, quick: bool) -> str:
    q = " --quick" if quick else ""
    return (f"drift suite run {suite.path}{q} --claim {claim.id} --jobs 2 && "
            f"drift suite report {suite.path}{q} --claims")


def _plot_claim(res: ClaimResult, columns: list[str], path: Path) -> bool:
    import matplotlib.pyplot as plt

    from drift_cli.plots import save_figure

    parts = res.claim.parts
    if not any(m.mean is not None for ms in res.parts.values() for m in ms):
        return False
    fig, axes = plt.subplots(1, len(parts), figsize=(max(4.0, 3.2 * len(parts)), 3.4), squeeze=False)
    for ax, (j, part) in zip(axes[0], enumerate(parts)):
        for i, col in enumerate(columns):
            m = res.parts[col][j]
            if m.mean is None:
                continue
            err = [[m.mean - m.ci[0]], [m.ci[1] - m.mean]] if m.ci else None
            ax.errorbar([i], [m.mean], yerr=err, fmt="o", capsize=4)
            ax.scatter([i] * len(m.values), m.values, s=8, alpha=0.5, color="grey")
        for t in ([part.threshold] if part.side in ("above", "below") else [part.threshold, -part.threshold]):
            ax.axhline(t, color="red", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(columns)), columns)
        ax.set_xlim(-0.6, len(columns) - 0.4)
        ax.set_title(part.label, fontsize=8)
    fig.suptitle(f"claim {res.claim.id}: {res.claim.title}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def _plot_curve(res: ClaimResult, columns: list[str], cols: dict[str, Column], path: Path) -> bool:
    import matplotlib.pyplot as plt

    from drift_cli.plots import save_figure

    curve = res.claim.curve
    assert curve is not None
    fig, axes = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.4), squeeze=False)
    drew = False
    for ax, col in zip(axes[0], columns):
        runs = [run for cell, labels, run in cols[col] if run is not None and matches(curve["where"], labels)]
        for run in runs:
            for method in curve["methods"]:
                pts = run["methods"].get(method, {}).get("alpha_curve") or []
                if pts:
                    drew = True
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{method} ({run['cell']['coords'].get('shuffle', '')})",
                            linewidth=1)
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("verification step")
        ax.set_ylabel(f"α (window of {metrics.ALPHA_WINDOW} steps)")
        if ax.lines:
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    if drew:
        save_figure(fig, path)
    plt.close(fig)
    return drew


def gain_note(gain: bool, rivals: bool | None, claim_verdict: str) -> str:
    """What a claim's verdict adds when it is about DRIFT's gain and copying alone reaches DRIFT's speedup."""
    if gain and rivals and claim_verdict != "not measured":
        return "DRIFT's gain cannot be told apart from copying here"
    return ""


def render(suite: Suite, spec: ClaimsSpec, runs: dict[str, RunJson], states: dict[str, str], manifest: dict,
           out: Path, quick: bool = False, selection: str = "",
           assessed: tuple[list[str], list[ClaimResult]] | None = None, out_flag: str = "") -> str:
    """The claims report's markdown; writes its PNGs into `<out's stem>/` beside it. `assessed`:
    `assess`'s result, when the caller has it (write_claims builds the record from the same).
    out_flag: ` --claims-out PATH` when the report goes elsewhere than the suite's [claims] out, so
    that its regenerate line rewrites this report and not the suite's own."""
    columns, results = assessed if assessed is not None else assess(suite, spec, runs)
    cols = columns_of(suite, spec, runs)
    plot_dir = out.parent / out.stem
    rel = plot_dir.name
    counts = {s: sum(1 for v in states.values() if v == s) for s in store.STATES}
    walls = manifest.get("wall_s", {})
    cell_wall = sum(walls.get(k, 0.0) for k, s in states.items() if s == "done")
    q = " --quick" if quick else ""
    lines = [f"# The seeds' claims, measured (suite `{suite.name}`)", "",
             "Regenerate everything below with", "", "```bash",
             f"drift suite run {suite.path}{q}{selection} --jobs 2 && drift suite report {suite.path}{q}{selection} --claims{out_flag}",
             "```", "",
             VERDICT_RULE, "",
             f"Columns: the {columns_text(spec)} ({', '.join(f'`{c}`' for c in columns)}). Repeats (the units of "
             f"every CI): {' / '.join(f'`{a}`' for a in spec.repeat)}. The suite has {len(suite.cells)} cells: "
             + ", ".join(f"{n} {s}" for s, n in counts.items())
             + f"; the finished cells took {cell_wall / 60:.1f} min of cell wall time in all (`suite.json`). "
             "Every figure is read from a cell's run.json; each row's command re-runs only that claim's cells.", "",
             pinning(manifest), "",
             "| # | claim (seed) | " + " | ".join(f"{c}: figure [95% CI], verdict" for c in columns)
             + " | copying control | reproduce | plot |",
             "|" + "---|" * (len(columns) + 5)]
    for res in results:
        c = res.claim
        plot = ""
        if _plot_claim(res, columns, plot_dir / f"claim-{c.id:02d}.png"):
            plot = f"![claim {c.id}]({rel}/claim-{c.id:02d}.png)"
        if c.curve and _plot_curve(res, columns, cols, plot_dir / f"claim-{c.id:02d}-alpha.png"):
            plot += f" ![claim {c.id} α over steps]({rel}/claim-{c.id:02d}-alpha.png)"
        quote = f"**{c.title}**<br>“{c.quote}” (*{SOURCES.get(c.seed, c.seed)}*)"
        figs = []
        for col in columns:
            if not c.parts:
                figs.append(f"not measured yet: {c.pending}<br>**verdict: not measured**")
                continue
            bits = []
            for part, m in zip(c.parts, res.parts[col]):
                line = f"{part.label} ({_side_text(part)}): {figure_text(m)} → {m.verdict}"
                if m.mean is None and c.pending:
                    line += f" ({c.pending})"
                bits.append(line)
            v = res.verdicts[col]
            if note := gain_note(c.gain, res.rivals.get(col), v):
                v += f"; {note}"
            figs.append("<br>".join(bits) + f"<br>**verdict: {v}**")
        ctrl = "<br>".join(f"{col}: {_copying_text(res.copying[col], res.rivals[col])}" for col in columns) \
            if c.copying else "(not a DRIFT row)"
        lines.append("| " + " | ".join(_cell(x) for x in
                                       [str(c.id), quote, *figs, ctrl, f"`{reproduce(suite, c, quick)}`", plot]) + " |")
    lines += ["", "## Notes per claim", ""]
    for res in results:
        c = res.claim
        lines.append(f"- **{c.id}.** " + (c.note or c.title) + (f" Pending: {c.pending}" if c.pending and not c.parts else ""))
        for part in c.parts:
            ops = "; ".join(f"`{n}` = `{op.metric}` on {_where_text(op.where)}" for n, op in part.operands.items())
            lines.append(f"  - {part.label}: figure `{part.figure}` {_side_text(part)}, where {ops}.")
    return "\n".join(lines) + "\n"


def write_claims(suite: Suite, root: Path, out: Path | None = None, quick: bool = False,
                 claim_ids: tuple[int, ...] = (), selection: str = "") -> Path:
    """The claims report (markdown + PNGs), written atomically; returns its path. claim_ids: only
    these claims (BadInput on an id the suite does not declare); selection: the `--only` / `--claim`
    arguments that chose the cells and claims, for the report's regenerate line."""
    import json
    from dataclasses import replace

    spec = load_claims(suite)
    if claim_ids:
        known = {c.id for c in spec.claims}
        for cid in claim_ids:
            if cid not in known:
                raise unknown("claim", str(cid), [str(i) for i in sorted(known)])
        spec = replace(spec, claims=tuple(c for c in spec.claims if c.id in claim_ids))
    states = store.status(root, suite)
    runs = {k: r for k in states if states[k] == "done" and (r := store.load_cell(root, k)) is not None}
    manifest = json.loads((root / "suite.json").read_text()) if (root / "suite.json").is_file() else {}
    path = Path(out) if out is not None else spec.out
    assessed = assess(suite, spec, runs)
    out_flag = "" if path == Path(spec.out) else f" --claims-out {path.as_posix()}"
    text = render(suite, spec, runs, states, manifest, path, quick, selection, assessed, out_flag)
    rec = claim_record(suite, spec, assessed, path, quick, selection + out_flag)
    atomic_write_bytes(path, text.encode())
    atomic_write_bytes(record_path(path), (strict_json(rec, indent=1) + "\n").encode())
    return path


# --- the claim record: what drift claims index reads ---------------------------------------------

def record_path(report: Path) -> Path:
    """Where the report at `report` keeps its claim record."""
    report = Path(report)
    return report.parent / RECORDS_DIR / f"{report.stem}.json"


def _measured_json(m: Measured) -> dict:
    return {"mean": m.mean, "ci": list(m.ci) if m.ci else None, "n": len(m.values), "verdict": m.verdict,
            "reason": m.reason, "cells": list(m.cells)}


def claim_record(suite: Suite, spec: ClaimsSpec, assessed: tuple[list[str], list[ClaimResult]], report: Path,
                 quick: bool = False, selection: str = "") -> dict:
    """The report's claims as data (the fields drift_cli/suite/claims_index.py checks and reads),
    from the same results as its markdown."""
    columns, results = assessed
    claims = []
    for res in results:
        c = res.claim
        per_column = {}
        for col in columns:
            copying = ({"rivals": res.rivals.get(col), "text": _copying_text(res.copying[col], res.rivals[col])}
                       if c.copying else None)
            per_column[col] = {"verdict": res.verdicts[col], "copying": copying,
                               "parts": [_measured_json(m) for m in res.parts[col]]}
        claims.append({
            "id": c.id, "title": c.title, "quote": c.quote, "source": SOURCES.get(c.seed, c.seed), "gain": c.gain,
            "pending": c.pending,
            "parts": [{"label": p.label, "figure": p.figure, "side": p.side, "threshold": p.threshold,
                       "operands": [{"name": n, "metric": op.metric, "where": op.where} for n, op in p.operands.items()]}
                      for p in c.parts],
            "columns": per_column})
    names = (spec.columns,) if isinstance(spec.columns, str) else spec.columns
    return {"record": RECORD_VERSION, "suite": suite.name, "suite_file": str(suite.path), "report": Path(report).name,
            "quick": quick, "selection": selection.strip(), "derived_from": "cells", "column_settings": list(names),
            "repeat": list(spec.repeat), "columns": list(columns), "claims": claims}
