"""Suite files (`suites/*.toml`): a declared grid of bench runs, expanded into cells.

    version = 1
    description = "..."
    [base]                  # settings every cell shares
    zoo = "micro"
    [grid]                  # setting = [values]: every combination is a cell
    scenario = ["code", "law"]
    seed = [0, 1, 2]
    [axes.decoding]         # a named axis: each point sets several settings together
    greedy = { temperature = 0.0, methods = "all" }
    sampled = { temperature = 0.8, methods = "vanilla,drift" }

A setting is a `drift bench` option by its Python name (`max_prompts`, `top_p`, `gain`, ...;
dashes are accepted for underscores; `batch_size` included). Grid keys and named axes are crossed.
Each cell's resolved settings (every bench option, defaults filled in) are hashed into its key;
batch size 1 stays out of it, so the keys of suites written before batching are unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drift_cli.bench_config import BenchConfig, check_preset
from drift_cli.errors import BadInput
from drift_cli.knobs import Knob, coerce, default_of, knobs
from drift_cli.registry import unknown

SUITE_VERSION = 1
TABLES = ("version", "description", "base", "grid", "axes", "exclude", "quick", "claims", "claim")
QUICK_SUFFIX = "-quick"     # the --quick variant's results live in <suite>-quick/
MAX_CELLS = 100_000         # a larger grid is refused before it is expanded
NOT_SETTINGS = ("out", "options", "batch_sizes")   # BenchConfig fields a suite does not set (the run
#                                                    sets out; a batch-size axis is a grid key)
# Settings added after suites had written cells: at their default they stay out of the key, so
# that the cells written before them keep their keys (any other value enters it as usual).
KEY_IF_SET = {"shuffle": 0, "batch_size": 1, "switch_after": None, "switch_target": None, "draft_layers": None,
              "drafter": "layer", "draft_kind": "auto", "background_load": False}
KEY_IF_SET_OPTIONS = {"offline_on_policy": None,   # method options likewise (None: not given)
                      "gamma_policy": None, "gamma_p_min": None, "gamma_ema_rate": None, "gamma_cost_decay": None,
                      "residuals": None, "osd_train": None, "hybrid_copy": None, "hybrid_model": None, "hybrid_rule": None,
                      "hybrid_min_score": None, "hybrid_min_length": None, "hybrid_learn_copied": None,
                      "osd_async": None, "osd_threads": None,
                      "tree_nodes": None, "tree_shape": None, "tree_branch": None, "tree_learn": None}


@dataclass(frozen=True)
class Cell:
    key: str                          # sha256 of the resolved settings, 12 hex digits
    coords: tuple[tuple[str, str], ...]   # (axis, value label) in axis order
    settings: dict[str, Any]          # BenchConfig keyword arguments (less out); options: method flags

    def coord(self, axis: str) -> str | None:
        return dict(self.coords).get(axis)


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    description: str
    axes: tuple[str, ...]             # grid keys, then named axes, in file order
    cells: tuple[Cell, ...]


@functools.cache                  # read once per process: a suite resolves every cell against them
def _method_knobs() -> dict[str, tuple[Knob, Any]]:
    """Every registered method's settings by option name: (knob, default)."""
    from drift_cli.methods import settings_classes

    out: dict[str, tuple[Knob, Any]] = {}
    for cls in settings_classes():
        for f, k in knobs(cls):
            if k.cli:
                out.setdefault(k.name, (k, default_of(f)))
    return out


@functools.cache
def _bench_knobs() -> dict[str, Knob]:
    """BenchConfig's settings a suite sets, by field name (a cell's keyword arguments)."""
    return {f.name: k for f, k in knobs(BenchConfig) if f.name not in NOT_SETTINGS}


@functools.cache
def _bench_fields() -> dict[str, Any]:
    base = BenchConfig()
    return {name: getattr(base, name) for name in _bench_knobs()}


def setting_knobs() -> dict[str, tuple[Knob, Any]]:
    """Every setting a suite (or `--set`) may give, by name: (its knob, its default)."""
    return {**{name: (k, _bench_fields()[name]) for name, k in _bench_knobs().items()}, **_method_knobs()}


def _setting_names() -> list[str]:
    return [*_bench_fields(), *_method_knobs()]


def _key(name: str, where: str) -> str:
    key = name.replace("-", "_")
    names = _setting_names()
    if key not in names:
        raise unknown(f"setting in {where}", name, names)
    return key


def _value(key: str, value: Any, where: str) -> Any:
    """Type-check one setting as its flag's kind (strictly: 1.5 is no integer, true no number);
    its rule is checked with the cell's (`validate_cell`)."""
    k = _bench_knobs()[key] if key in _bench_knobs() else _method_knobs()[key][0]
    try:
        value = coerce(k, value, check=False)
    except BadInput as e:
        raise BadInput(f"{where}: {key} = {e}") from None
    return str(value) if isinstance(value, Path) else value


def _table(raw: dict, name: str) -> dict:
    t = raw.get(name, {})
    if not isinstance(t, dict):
        raise BadInput(f"[{name}] must be a table")
    return t


def _settings(table: dict, where: str) -> dict[str, Any]:
    out = {}
    for k, v in table.items():
        key = _key(k, where)
        out[key] = _value(key, v, where)
    return out


def _label(value: Any) -> str:
    return "none" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def parse_suite(path: Path, raw: dict) -> tuple[str, dict, list[tuple[str, list[tuple[str, dict]]]]]:
    """(description, base settings, axes): each axis a list of (label, settings) points."""
    for k in raw:
        if k not in TABLES:
            raise unknown("suite table", k, TABLES)
    if raw.get("version") != SUITE_VERSION:
        raise BadInput(f"{path}: version = {raw.get('version')!r}; this drift-bench reads suite version {SUITE_VERSION}")
    base = _settings(_table(raw, "base"), "[base]")
    axes: list[tuple[str, list[tuple[str, dict]]]] = []
    for k, values in _table(raw, "grid").items():
        key = _key(k, "[grid]")
        if not isinstance(values, list):
            raise BadInput(f"[grid] {k} must be a list of values (a single value belongs in [base])")
        if not values:
            raise BadInput(f"[grid] {k} is empty: the suite has no cells")
        axes.append((key, [(_label(v), {key: _value(key, v, f"[grid] {k}")}) for v in values]))
    for name, points in _table(raw, "axes").items():
        if not isinstance(points, dict) or not points:
            raise BadInput(f"[axes.{name}] must be a non-empty table of points (label = {{ setting = value, ... }})")
        pts = []
        for label, settings in points.items():
            if not isinstance(settings, dict):
                raise BadInput(f"[axes.{name}] {label} must be a table of settings")
            pts.append((label, _settings(settings, f"[axes.{name}] {label}")))
        axes.append((name, pts))
    if not axes:
        raise BadInput(f"{path}: the suite declares no grid: give [grid] lists or [axes.NAME] points")
    return str(raw.get("description", "")), base, axes


def cell_key(settings: dict) -> str:
    keyed = {k: v for k, v in settings.items() if not (k in KEY_IF_SET and v == KEY_IF_SET[k])}
    if keyed.get("dtype") == "auto":   # the default since --dtype auto; suites run on the CPU, where it is float32:
        keyed["dtype"] = "float32"     # the keys of suites written before it stay unchanged
    if isinstance(keyed.get("options"), dict):
        keyed["options"] = {k: v for k, v in keyed["options"].items()
                            if not (k in KEY_IF_SET_OPTIONS and v == KEY_IF_SET_OPTIONS[k])}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:12]


def resolve_cell(base: dict, point: list[tuple[str, str, dict]]) -> Cell:
    """One cell's full settings: bench defaults < [base] < its grid values and axis points."""
    explicit = dict(base)
    seen: dict[str, str] = {}
    for axis, _, settings in point:
        for k, v in settings.items():
            if k in seen:
                raise BadInput(f"setting {k} is set by both axis {seen[k]} and axis {axis}")
            seen[k] = axis
            explicit[k] = v
    if "corpus" in explicit and explicit["corpus"] is not None and "scenario" not in explicit:
        explicit["scenario"] = None
    method_opts = _method_knobs()
    settings = _bench_fields() | {k: v for k, v in explicit.items() if k not in method_opts}
    settings["options"] = {k: explicit.get(k) for k in method_opts}
    return Cell(cell_key(settings), tuple((axis, label) for axis, label, _ in point), settings)


def validate_cell(cell: Cell) -> None:
    """The checks `drift bench` makes before loading a model, with the cell's coordinates in the
    message. A setting that a cell's methods do not read is not refused here: a suite's [base]
    may serve cells of other methods (`check_read` refuses one that no cell reads)."""
    cfg = BenchConfig(**cell.settings)
    try:
        cfg.validate(unread_ok=True)
        if cfg.corpus is None:
            from drift_cli import scenarios

            scenarios.load_scenario(cfg.scenario)
        check_preset(cfg)
    except BadInput as e:
        where = ", ".join(f"{a}={v}" for a, v in cell.coords)
        raise BadInput(f"cell {where}: {e}") from None


def check_read(path: Path, cells: list[Cell]) -> None:
    """Refuse a method or controller setting that no cell of the suite reads (its flag would do nothing)."""
    from drift_cli.bench_config import unread_option

    given = {k for c in cells for k, v in c.settings["options"].items() if v is not None}
    unread: dict[str, str] = {}
    for cell in cells:
        cfg = BenchConfig(**cell.settings)
        for key in list(given):
            message = unread_option(cfg, only=key)
            if message is None:
                given.discard(key)
                unread.pop(key, None)
            else:
                unread.setdefault(key, message)
        if not given:
            return
    key = sorted(given)[0]
    raise BadInput(f"{path}: setting {key} is read by no cell of the suite ({unread[key].partition(', which')[0]})")


def parse_override(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (VALUE a TOML value; a bare word is a string) -> (key, value)."""
    from drift_cli.scenarios.schema import tomllib

    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise BadInput(f"--set {text!r}: expected KEY=VALUE")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return _key(key.strip(), "--set"), parsed


def apply_overrides(raw: dict, overrides: dict[str, Any]) -> dict:
    """Each override fixes its setting for every cell: it goes into [base] and out of the grid and axes."""
    raw = {**raw, "base": dict(_table(raw, "base")), "grid": dict(_table(raw, "grid")),
           "axes": {n: {p: dict(v) if isinstance(v, dict) else v for p, v in pts.items()} if isinstance(pts, dict) else pts
                    for n, pts in _table(raw, "axes").items()}}
    norm = lambda k: k.replace("-", "_")  # noqa: E731
    for key, value in overrides.items():
        raw["base"] = {k: v for k, v in raw["base"].items() if norm(k) != key} | {key: value}
        raw["grid"] = {k: v for k, v in raw["grid"].items() if norm(k) != key}
        for pts in raw["axes"].values():
            for settings in pts.values() if isinstance(pts, dict) else ():
                if isinstance(settings, dict):
                    for k in [k for k in settings if norm(k) == key]:
                        del settings[k]
    return raw


def _selection(table: Any, where: str) -> list[dict[str, list[str]]]:
    """[exclude] entries / [quick] keep: axis -> labels (a single label or a list of them)."""
    entries = table if isinstance(table, list) else [table]
    out = []
    for e in entries:
        if not isinstance(e, dict) or not e:
            raise BadInput(f"{where} must be a table of axis = label (or [labels])")
        out.append({k: [_label(x) for x in (v if isinstance(v, list) else [v])] for k, v in e.items()})
    return out


def _matches(sel: dict[str, list[str]], labels: dict[str, str]) -> bool:
    return all(labels.get(axis) in wanted for axis, wanted in sel.items())


def quick_variant(raw: dict, path: Path) -> dict:
    """The [quick] table applied: its `set` fixes settings like --set, its `keep` keeps only the
    listed points of each named axis (the CI-sized variant of a suite)."""
    q = raw.get("quick")
    if not isinstance(q, dict):
        raise BadInput(f"{path} has no [quick] table: it offers no --quick variant")
    unknown_keys = [k for k in q if k not in ("set", "keep")]
    if unknown_keys:
        raise unknown("[quick] key", unknown_keys[0], ("set", "keep"))
    raw = apply_overrides(raw, {_key(k, "[quick.set]"): v for k, v in _table(q, "set").items()})
    raw["_keep"] = _selection(q["keep"], "[quick.keep]") if "keep" in q else []
    return raw


def parse_only(texts: tuple[str, ...]) -> dict[str, list[str]]:
    """`--only AXIS=LABEL[,LABEL...]` (repeatable) -> axis -> labels."""
    out: dict[str, list[str]] = {}
    for text in texts:
        axis, eq, labels = text.partition("=")
        if not eq or not axis.strip() or not labels.strip():
            raise BadInput(f"--only {text!r}: expected AXIS=LABEL[,LABEL...]")
        out[axis.strip()] = [x.strip() for x in labels.split(",") if x.strip()]
    return out


def select_cells(suite: Suite, only: dict[str, list[str]]) -> Suite:
    """The suite less the cells outside `only` (axis -> labels; a setting fixed in [base] matches by value)."""
    from dataclasses import replace

    for axis in only:
        if axis not in suite.axes and axis not in suite.cells[0].settings:
            raise unknown("axis in --only", axis, list(suite.axes))
    keep = [c for c in suite.cells
            if all((c.coord(a) if a in suite.axes else _label(c.settings.get(a))) in labels for a, labels in only.items())]
    if not keep:
        raise BadInput("--only leaves no cell of the suite")
    return replace(suite, cells=tuple(keep))


def check_size(path: Path, axes: list[tuple[str, list]]) -> None:
    """Refuse a grid of more than MAX_CELLS combinations, counted from the axes' sizes before any is expanded."""
    n = math.prod(len(points) for _, points in axes)
    if n > MAX_CELLS:
        sizes = " × ".join(f"{len(points)} {name}" for name, points in axes)
        raise BadInput(f"{path}: the grid has {n:,} cells ({sizes}); a suite holds at most {MAX_CELLS:,}: "
                       "split it into several suites, or fix settings with --set")


def load_suite(path: Path, overrides: dict[str, Any] | None = None, quick: bool = False) -> Suite:
    from drift_cli.scenarios.schema import read_toml

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"no suite file at {path}")
    try:
        raw = read_toml(path)
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                       "a suite file is TOML, which is UTF-8") from None
    if quick:
        raw = quick_variant(raw, path)
    keep = raw.pop("_keep", [])
    if overrides:
        raw = apply_overrides(raw, overrides)
    description, base, axes = parse_suite(path, raw)
    check_size(path, axes)
    exclude = _selection(raw["exclude"], "[[exclude]]") if "exclude" in raw else []
    names = {name for name, _ in axes} | set(base)   # a setting fixed by --set is matched by its value
    for sel in [*exclude, *keep]:
        for axis in sel:
            if axis not in names:
                raise unknown("axis in [[exclude]] or [quick.keep]", axis, sorted(names))
    fixed = {k: _label(v) for k, v in base.items()}
    cells: dict[str, Cell] = {}
    for combo in itertools.product(*[[(name, label, s) for label, s in points] for name, points in axes]):
        labels = fixed | {name: label for name, label, _ in combo}
        if any(_matches(sel, labels) for sel in exclude) or (keep and not all(_matches(sel, labels) for sel in keep)):
            continue
        cell = resolve_cell(base, list(combo))
        cells.setdefault(cell.key, cell)      # two points that resolve alike are one cell
    checked: dict[tuple, Cell] = {}
    for cell in cells.values():
        sig = tuple(sorted((k, str(v)) for k, v in cell.settings.items() if k != "seed"))
        if sig not in checked:            # the seed never makes a cell invalid
            checked[sig] = cell
            validate_cell(cell)
    check_read(path, list(checked.values()))
    if not cells:
        raise BadInput(f"{path}: [[exclude]] or [quick.keep] leaves the suite no cells")
    name = path.stem + (QUICK_SUFFIX if quick else "")
    return Suite(name, path, description, tuple(name for name, _ in axes), tuple(cells.values()))
