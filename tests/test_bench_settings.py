"""The run's settings, declared once: `BenchConfig`'s fields and every method's and controller's
settings carry their flag, help, default and check; every command shows them alike; a flag that
nothing in the run reads is refused; every numeric flag survives subnormal and huge values; and a
refusal never imports torch."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import click
import pytest

import drift_cli
from drift_cli import knobs
from drift_cli.bench_config import BenchConfig
from drift_cli.cli import cli, main
from drift_cli.commands.options import NOT_IN_ABLATE
from drift_cli.methods import owners, settings_classes
from drift_cli.suite.spec import NOT_SETTINGS

ROOT = Path(drift_cli.__file__).parent
MICRO = ["--zoo", "micro", "--scenario", "jargon", "--max-prompts", "2", "--max-new-tokens", "8", "--no-control"]


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# -- one declaration --------------------------------------------------------------------------

def test_every_bench_config_field_has_exactly_one_declaration():
    """Each field is a knob (flag, help, default, check in one place), no flag is declared twice
    among the run's and the methods' settings, and no command that runs models declares a click option for one."""
    fields = [f for f in BenchConfig.__dataclass_fields__.values() if f.name != "options"]
    declared = dict(knobs.knobs(BenchConfig))
    assert all(f.name in {g.name for g in declared} for f in fields)
    flags = [k.flag for _, k in knobs.knobs(BenchConfig)]
    assert len(set(flags)) == len(flags)
    method_flags = {k.flag for cls in settings_classes() for _, k in knobs.knobs(cls)}
    assert not method_flags & {k.flag for _, k in knobs.knobs(BenchConfig)}
    bench_flags = {k.flag for _, k in knobs.knobs(BenchConfig)} | {k.off_flag for _, k in knobs.knobs(BenchConfig)}
    bench_flags -= {"--out", "--methods"}   # `report`'s and `suite`'s --out name other directories; ablate's
    #                                         --methods are the methods its sweep runs
    commands = [ROOT / "cli.py", *(ROOT / "commands" / m for m in ("ablate.py", "analyze.py", "options.py", "suite.py"))]
    for path in commands:                              # no hand-written option for a setting in the commands that run
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("option", "Option"):
                literals = {a.value for a in node.args if isinstance(a, ast.Constant)}
                literals |= {e.value for a in node.args if isinstance(a, ast.List) for e in a.elts
                             if isinstance(e, ast.Constant)}
                assert not literals & bench_flags, (path, literals & bench_flags)
    assert "jargon" not in (ROOT / "cli.py").read_text() + (ROOT / "commands" / "ablate.py").read_text()


def _help_records(args: list[str]) -> dict[str, str]:
    """`drift ARGS --help`, unwrapped: setting name -> the help text shown for it."""
    cmd: click.Command = cli
    ctx = cli.make_context("drift", list(args), resilient_parsing=True)
    for name in args:
        cmd = cmd.get_command(ctx, name)               # type: ignore[union-attr]
        ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
    formatter = click.HelpFormatter(width=100_000, max_width=100_000)
    cmd.format_help(ctx, formatter)
    by_flag = {k.flag: k.name for cls in [BenchConfig, *settings_classes()] for _, k in knobs.knobs(cls)}
    names = set(by_flag.values())
    out = {}
    for line in formatter.getvalue().splitlines():
        parts = line.strip().split("  ", 1)
        if len(parts) != 2:
            continue
        term, text = parts[0].split()[0].split("/")[0], parts[1].strip()
        name = by_flag.get(term, term if term in names else None)
        if name is not None:
            out[name] = text
    return out


def test_bench_ablate_and_suite_run_show_each_setting_alike():
    bench, ablate, suite = _help_records(["bench"]), _help_records(["ablate"]), _help_records(["suite", "run"])
    for name in NOT_IN_ABLATE:                         # ablate's own --methods is another setting
        ablate.pop(name, None)
    for name in NOT_SETTINGS:                          # suite run's --out is the suites' results root
        suite.pop(name, None)
    assert {"scenario", "gamma", "temperature", "gain", "gamma_p_min", "osd_lr"} <= set(bench) & set(suite)
    assert {"scenario", "gamma", "gain"} <= set(ablate)
    assert bench["scenario"].endswith("[default: jargon]") and bench["gamma"] == "draft block size [default: 4]"
    for other in (ablate, suite):
        for name in set(bench) & set(other):
            assert bench[name] == other[name], name


# -- flags that nothing reads -----------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--methods", "vanilla", "--gain", "0.5"], "--gain is only used by the drift method, which --methods vanilla"),
    (["--methods", "vanilla", "--gamma-p-min", "0.5"],
     "--gamma-p-min is only used by the confidence γ controller, which --gamma-policy fixed does not select"),
    (["--methods", "vanilla", "--gamma-policy", "ema", "--gamma-cost-decay", "0.9"],
     "--gamma-cost-decay is only used by the cost γ controller, which --gamma-policy ema does not select"),
    (["--methods", "drift", "--residuals", "5"], "--residuals is only used by the vanilla method, which --methods drift"),
    (["--methods", "vanilla", "--bank-in", "/tmp/x"], "--bank-in is only used by the drift method"),
    (["--methods", "pld", "--divergence", "rkl"], "--divergence is only used by the offline and osd methods"),
    (["--methods", "vanilla", "--no-adaptive-rate"], "--adaptive-rate is only used by the drift method"),
    (["--methods", "vanilla", "--tree-shape", "static"], "--tree-shape shapes token trees, which only --tree-nodes N"),
    (["--methods", "drift", "--tree-nodes", "0", "--tree-learn", "all"], "--tree-learn shapes token trees"),
    (["--methods", "suffix,pld", "--tree-nodes", "8", "--tree-branch", "2"],
     "--tree-branch shapes the trees a draft model grows; --methods suffix,pld runs none"),
    (["--methods", "vanilla,suffix", "--tree-nodes", "8", "--tree-learn", "all"],
     "--tree-learn is only used by the drift method (its bank on trees), which --methods vanilla,suffix does not run"),
    (["--methods", "hybrid", "--hybrid-model", "osd", "--tree-nodes", "8", "--tree-learn", "path"],
     "(hybrid runs it as --hybrid-model drift)"),
])
def test_a_flag_whose_owner_is_not_selected_is_refused(args, message, capsys):
    code, out, err = run_cli(["bench", *MICRO, *args], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err


class Accepted(Exception):
    """Raised in place of the run: the command got past every check."""


@pytest.fixture
def no_run(monkeypatch):
    from drift_cli import bench
    from drift_cli.commands import ablate

    def accepted(*args, **kwargs):
        raise Accepted
    monkeypatch.setattr(bench, "run_bench", accepted)
    monkeypatch.setattr(ablate, "run_ablation", accepted)


@pytest.mark.parametrize("args", [
    ["bench", *MICRO, "--methods", "vanilla,drift", "--gain", "0.5", "--residuals", "4"],
    ["bench", *MICRO, "--methods", "osd", "--divergence", "rkl"],          # shared with offline: osd reads it
    ["bench", *MICRO, "--methods", "vanilla", "--gamma-policy", "confidence", "--gamma-p-min", "0.5"],
    ["bench", *MICRO, "--gain", "0.5"],                                        # --methods all runs drift
    ["bench", *MICRO, "--methods", "hybrid", "--tree-nodes", "8", "--tree-learn", "all", "--tree-shape", "static"],
    ["bench", *MICRO, "--methods", "pld,offline", "--tree-nodes", "4", "--tree-branch", "2"],
    ["ablate", *MICRO[:-1], "--sweep", "gamma-policy", "--values", "fixed,confidence", "--gamma-p-min", "0.5"],
    ["ablate", *MICRO[:-1], "--sweep", "eta", "--gain", "0.5", "--bank-in", "/nonexistent"],
])
def test_flags_the_run_reads_are_accepted(args, no_run, capsys):
    with pytest.raises(Accepted):
        main(args)


def test_ablate_refuses_a_flag_its_sweep_overrides(capsys):
    code, _, err = run_cli(["ablate", *MICRO[:-1], "--sweep", "lambda", "--gain", "0.5"], capsys)
    assert code == 2 and "--gain is swept by --sweep lambda: give its values with --values" in err
    code, _, err = run_cli(["ablate", *MICRO[:-1], "--sweep", "gamma-policy", "--values", "fixed,hf",
                            "--gamma-p-min", "0.5"], capsys)
    assert code == 2 and "--gamma-p-min is only used by the confidence γ controller, which --gamma-policy " \
                         "fixed,hf does not select" in err


def test_a_suite_setting_is_refused_only_when_no_cell_reads_it(tmp_path):
    from drift_cli.errors import BadInput
    from drift_cli.suite.spec import load_suite

    base = 'version = 1\n[base]\nzoo = "micro"\ngain = 0.5\n[grid]\nmethods = '
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(base + '["vanilla", "drift"]\n')
    assert len(load_suite(mixed).cells) == 2             # [base] serves the drift cell
    unread = tmp_path / "unread.toml"
    unread.write_text(base + '["vanilla", "pld"]\n')
    with pytest.raises(BadInput, match="setting gain is read by no cell of the suite .--gain is only used by the drift"):
        load_suite(unread)


# -- numeric edges ----------------------------------------------------------------------------

FLOATS = ("1e-300", "5e-324", "1e300", "inf", "nan")
INTS = (str(2**31), str(2**63), str(10**12))


def numeric_cases() -> list:
    """(flag, value, the flags that select its reader) for every numeric flag of BenchConfig and
    of every method's and controller's settings: a new knob is covered without editing this."""
    cases = []
    for cls in [BenchConfig, *settings_classes()]:
        for _, k in knobs.knobs(cls):
            if not k.cli or k.kind not in (int, float) or k.choices:
                continue
            users = owners(cls) if cls is not BenchConfig else []
            select = ["--methods", users[0] if users else "vanilla"]
            if k.needs is not None:
                select += [knobs.find(cls, k.needs[0])[1].flag, k.needed()[0]]
            cases += [pytest.param(k.flag, v, select, id=f"{k.flag}={v}") for v in (*FLOATS, *INTS)]
    return cases


def _outcome(code, err: str, flag: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert code == 0 or (code == 2 and len(lines) == 1 and flag in lines[0]), (code, err)


@pytest.mark.parametrize("flag,value,select", numeric_cases())
def test_a_numeric_edge_is_refused_in_one_line_or_passes_every_check(flag, value, select, no_run, capsys, tmp_path):
    """Before any model loads: exit 2 with one line naming the flag, or on to the run."""
    try:
        code, _, err = run_cli(["bench", *MICRO, "--out", str(tmp_path), *select, flag, value], capsys)
    except Accepted:
        return
    _outcome(code, err, flag)


@pytest.mark.slow
@pytest.mark.parametrize("flag,value,select", numeric_cases())
def test_an_accepted_numeric_edge_runs_or_is_refused_in_one_line(flag, value, select, capsys, tmp_path):
    """The values that pass the checks, run on the micro zoo: exit 0, or 2 with one line (a bound
    that needs the models, such as the context), never a traceback, a kill or a hang."""
    args = ["bench", *MICRO, "--out", str(tmp_path), *select, flag, value]
    code, out, err = run_cli(args, capsys)
    if code == 0:
        run = json.loads((next(tmp_path.rglob("run.json"))).read_text())
        assert run["complete"]
    _outcome(code, err, flag)


def test_the_edges_cover_every_numeric_flag():
    covered = {p.values[0] for p in numeric_cases()}
    assert {"--temperature", "--top-p", "--batch-size", "--threads", "--sigma", "--bank-size", "--osd-lr",
            "--osd-steps", "--pld-max-ngram", "--gamma-p-min"} <= covered
    assert all(math.isfinite(float(v)) or v in ("inf", "nan") for v in FLOATS)


# -- fast refusals ----------------------------------------------------------------------------

def test_the_command_line_and_its_refusals_do_not_import_torch():
    """One fresh interpreter: importing the CLI, `--help`, `bench --help`, a bad flag and a
    refused value, each checked for torch in sys.modules (no timing)."""
    script = """
import contextlib, io, json, sys
import drift_cli.cli
seen = {"import": "torch" in sys.modules}
for name, argv in [("help", ["--help"]), ("bench help", ["bench", "--help"]), ("bad flag", ["bench", "--bad-flag"]),
                   ("refused value", ["bench", "--temperature", "1e-300"]),
                   ("unread flag", ["bench", "--methods", "vanilla", "--gain", "0.5"])]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            drift_cli.cli.main(argv)
        except SystemExit as e:
            code = e.code
    seen[name] = ("torch" in sys.modules, code)
print(json.dumps(seen))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=ROOT.parent)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen == {"import": False, "help": [False, 0], "bench help": [False, 0], "bad flag": [False, 2],
                    "refused value": [False, 2], "unread flag": [False, 2]}, seen
