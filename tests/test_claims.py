"""The claims report: the verdict rule on hand-made cells, the shipped claims suite's shape, and
`drift suite report --claims` end to end on a micro-zoo suite of a few cells."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from drift_cli.cli import main
from drift_cli.errors import BadInput
from drift_cli.suite import claims as C
from drift_cli.suite.spec import Cell, Suite, load_suite

ROOT = Path(__file__).resolve().parent.parent
CLAIMS_SUITE = ROOT / "suites" / "claims.toml"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# --- the verdict rule --------------------------------------------------------------------------

@pytest.mark.parametrize("ci, side, t, want", [
    ((0.1, 0.3), "above", 0.0, "confirmed"),
    ((-0.3, -0.1), "above", 0.0, "refuted"),
    ((-0.1, 0.3), "above", 0.0, "inconclusive"),
    ((1.0, 2.0), "below", 3.0, "confirmed"),
    ((3.5, 4.0), "below", 3.0, "refuted"),
    ((2.0, 4.0), "below", 3.0, "inconclusive"),
    ((-0.01, 0.015), "within", 0.02, "confirmed"),
    ((0.03, 0.05), "within", 0.02, "refuted"),
    ((-0.05, -0.03), "within", 0.02, "refuted"),
    ((0.0, 0.05), "within", 0.02, "inconclusive"),
    ((0.02, 0.05), "outside", 0.01, "confirmed"),
    ((-0.005, 0.005), "outside", 0.01, "refuted"),
    ((0.0, 0.05), "outside", 0.01, "inconclusive"),
    (None, "above", 0.0, "inconclusive"),       # one repeat: no CI
])
def test_verdict_rule(ci, side, t, want):
    assert C.verdict(ci, side, t) == want


@pytest.mark.parametrize("parts, want", [
    (["confirmed", "confirmed"], "confirmed"),
    (["confirmed", "refuted"], "refuted"),
    (["confirmed", "inconclusive"], "inconclusive"),
    (["confirmed", "not measured"], "inconclusive"),
    (["not measured", "not measured"], "not measured"),
    ([], "not measured"),
])
def test_claim_verdict_combines_parts(parts, want):
    assert C.combine(parts) == want


def test_figure_expressions_are_arithmetic_only():
    assert C.evaluate("(a - b) / (c - b)", {"a": 3.0, "b": 1.0, "c": 5.0}) == 0.5
    assert C.evaluate("max(a, b) - abs(c)", {"a": 1.0, "b": 2.0, "c": -0.5}) == 1.5
    assert C.evaluate("a / b", {"a": 1.0, "b": 0.0}) is None
    base = {"id": 1, "title": "t", "seed": "s.txt", "quote": "q"}
    for bad in ("__import__('os')", "a.real", "a if a else b", "nope + a", "a +"):
        raw = {"claim": [{**base, "part": [{"figure": bad, "side": "above", "threshold": 0,
                                            "a": {"where": {"x": "y"}, "metric": "m"}}]}]}
        with pytest.raises(BadInput):
            C.parse_claims(raw, Path("x.toml"))


# --- hand-made cells: one axis "experiment", three shuffles ------------------------------------

def _cell(key: str, experiment: str, shuffle: int) -> Cell:
    return Cell(key, (("shuffle", str(shuffle)), ("experiment", experiment)),
                {"zoo": "micro", "shuffle": shuffle, "options": {}})


def _run(alpha_v: float, alpha_d: float) -> dict:
    return {"methods": {"vanilla": {"acceptance_rate": alpha_v}, "drift": {"acceptance_rate": alpha_d}}}


def _spec(side: str, threshold: float, b: str = "base") -> C.ClaimsSpec:
    part = C.Part("lift", "d - v", {"d": C.Operand({"experiment": ["a"]}, "methods.drift.acceptance_rate"),
                                     "v": C.Operand({"experiment": [b]}, "methods.vanilla.acceptance_rate")},
                  side, threshold)
    claim = C.Claim(1, "lift", "000.txt", "q", (part,))
    return C.ClaimsSpec("zoo", ("shuffle",), Path("claims.md"), (claim,))


def _hand_suite(lifts: list[float]) -> tuple[Suite, dict]:
    cells, runs = [], {}
    for i, lift in enumerate(lifts, 1):
        for exp in ("a", "base"):
            key = f"{exp}{i}"
            cells.append(_cell(key, exp, i))
            runs[key] = _run(0.4, 0.4 + lift) if exp == "a" else _run(0.4, 0.0)
    return Suite("hand", Path("hand.toml"), "", ("shuffle", "experiment"), tuple(cells)), runs


@pytest.mark.parametrize("lifts, want", [
    ([0.20, 0.22, 0.21], "confirmed"),        # CI well above 0
    ([-0.20, -0.22, -0.21], "refuted"),       # CI well below 0
    ([0.30, -0.25, 0.02], "inconclusive"),    # CI straddles 0
])
def test_verdicts_on_hand_made_cells(lifts, want):
    suite, runs = _hand_suite(lifts)
    _, [res] = C.assess(suite, _spec("above", 0.0), runs)
    m = res.parts["micro"][0]
    assert len(m.values) == 3 and m.values == pytest.approx(lifts)
    assert m.mean == pytest.approx(sum(lifts) / 3)
    assert res.verdicts["micro"] == want


def test_not_measured_cells_say_why():
    suite, runs = _hand_suite([0.2, 0.2, 0.2])
    # the operand names a point no cell has
    _, [res] = C.assess(suite, _spec("above", 0.0, b="absent"), runs)
    assert res.verdicts["micro"] == "not measured"
    assert "no cell of the suite matches experiment=absent" in res.parts["micro"][0].reason
    # the cells exist but have not run
    _, [res] = C.assess(suite, _spec("above", 0.0), {k: v for k, v in runs.items() if k.startswith("a")})
    assert res.verdicts["micro"] == "not measured"
    assert "have not run" in res.parts["micro"][0].reason
    # one repeat only: a figure but no CI, so inconclusive
    _, [res] = C.assess(suite, _spec("above", 0.0), {k: v for k, v in runs.items() if k.endswith("1")})
    assert res.parts["micro"][0].ci is None and res.verdicts["micro"] == "inconclusive"


def test_operands_pair_by_repeat_and_average_over_points():
    cells = [_cell(f"{e}{i}", e, i) for i in (1, 2) for e in ("x", "y")]
    runs = {"x1": _run(0.2, 0), "y1": _run(0.4, 0), "x2": _run(0.6, 0), "y2": _run(0.8, 0)}
    suite = Suite("s", Path("s.toml"), "", ("shuffle", "experiment"), tuple(cells))
    part = C.Part("p", "a", {"a": C.Operand({"experiment": ["x", "y"]}, "methods.vanilla.acceptance_rate")},
                  "above", 0.0)
    m = C.measure(part, C.columns_of(suite, C.ClaimsSpec("zoo", ("shuffle",), Path("c.md"), ()), runs)["micro"],
                  ("shuffle",))
    assert m.values == pytest.approx([0.3, 0.7])   # per shuffle, the mean over x and y


def test_copying_control_flags_copying_that_reaches_drift():
    def run(d, p):
        return {"methods": {"drift": {"speedup": d}, "pld": {"speedup": p}}, "stream": {"repeated_ngram_share": 0.5}}
    cells = [_cell(f"c{i}", "c", i) for i in (1, 2, 3)]
    suite = Suite("s", Path("s.toml"), "", ("shuffle", "experiment"), tuple(cells))
    claim = C.Claim(1, "t", "s.txt", "q", (), copying={"experiment": ["c"]}, pending="x")
    spec = C.ClaimsSpec("zoo", ("shuffle",), Path("c.md"), (claim,))
    _, [res] = C.assess(suite, spec, {f"c{i}": run(1.5 + i / 100, 1.0) for i in (1, 2, 3)})
    assert res.rivals["micro"] is False
    _, [res] = C.assess(suite, spec, {f"c{i}": run(1.5 + i / 100, 1.5) for i in (1, 2, 3)})
    assert res.rivals["micro"] is True
    assert "cannot be told apart" in C._copying_text(res.copying["micro"], True)


def test_read_metric_paths():
    run = {"methods": {"drift": {"alpha_curve": [[100, 0.5], [120, 0.6]], "x": None, "ok": True}}}
    assert C.read_metric(run, "methods.drift.alpha_curve.1.1") == 0.6
    assert C.read_metric(run, "methods.drift.alpha_curve.9.1") is None
    assert C.read_metric(run, "methods.drift.x") is None
    assert C.read_metric(run, "methods.drift.ok") is None
    assert C.read_metric(run, "methods.osd.acceptance_rate") is None


# --- the shipped suite ---------------------------------------------------------------------------

def test_shipped_claims_suite_declares_all_17_claims():
    suite = load_suite(CLAIMS_SUITE)
    spec = C.load_claims(suite)
    assert [c.id for c in spec.claims] == list(range(1, 18))
    assert {c.seed for c in spec.claims} == {"000_fee7b5e6130b3396.txt", "004_43ee447c85fbbb1f.txt"}
    seeds = ROOT.parent / "shared" / "seeds"     # the seed files live beside the checkout, where they exist
    for c in spec.claims:
        assert c.parts or c.pending
        if seeds.is_dir():
            text = " ".join((seeds / c.seed).read_text().split())
            for fragment in c.quote.split("[...]"):
                assert fragment.strip() in text, (c.id, fragment)
    assert all(c.settings["split"] == "test" for c in suite.cells)       # claims run on test streams only
    by_point: dict[tuple, set] = {}
    for c in suite.cells:
        by_point.setdefault((c.coord("zoo"), c.coord("experiment")), set()).add(c.settings["shuffle"])
    assert all(len(s) >= 3 for s in by_point.values())                    # >= 3 stream shuffles per cell
    drift_rows = [c for c in spec.claims if c.seed.startswith("000") and c.parts]
    assert all(c.copying for c in drift_rows)                              # copying control beside DRIFT rows
    quick = load_suite(CLAIMS_SUITE, quick=True)
    assert quick.name == "claims-quick" and {c.settings["zoo"] for c in quick.cells} == {"micro"}
    assert len(quick.cells) <= 33


def _suites_with_claims() -> list[Path]:
    from drift_cli.scenarios.schema import read_toml

    return [p for p in sorted((ROOT / "suites").glob("*.toml")) if "claim" in read_toml(p)]


@pytest.mark.parametrize("path", _suites_with_claims(), ids=lambda p: p.stem)
def test_every_operand_of_a_shipped_suites_claims_reads_some_cell(path):
    """A mistyped axis label in a claim's `where` would leave its part "not measured" for ever."""
    suite = load_suite(path)
    spec = C.load_claims(suite)
    labels = [C.cell_labels(suite, c) for c in suite.cells]
    for claim in spec.claims:
        wheres = [op.where for p in claim.parts for op in p.operands.values()] + ([claim.copying] if claim.copying else [])
        for where in wheres:
            assert any(C.matches(where, lab) for lab in labels), (path.name, claim.id, where)


def test_claims_report_refuses_a_suite_without_claims(tmp_path, capsys):
    p = tmp_path / "plain.toml"
    p.write_text('version = 1\n[base]\nzoo = "micro"\n[grid]\nseed = [0, 1]\n')
    code, _, err = run_cli(["suite", "report", str(p), "--claims", "--out", str(tmp_path)], capsys)
    assert code == 2 and "no [[claim]] tables" in err
    code, _, err = run_cli(["suite", "run", str(p), "--quick", "--out", str(tmp_path)], capsys)
    assert code == 2 and "no [quick] table" in err


def test_a_claim_without_cells_says_why(tmp_path, capsys):
    suite_file = tmp_path / "mc.toml"
    suite_file.write_text(MICRO)
    code, _, err = run_cli(["suite", "run", str(suite_file), "--claim", "3", "--out", str(tmp_path)], capsys)
    assert code == 2 and "claim 3 reads no cell" in err and "the micro zoo has one draft per target" in err
    code, _, err = run_cli(["suite", "run", str(CLAIMS_SUITE), "--claim", "99", "--out", str(tmp_path)], capsys)
    assert code == 2 and "claim" in err


def test_shuffle_draws_another_stream():
    from drift_cli import scenarios
    from drift_cli.zoo import ensure_zoo
    from drift_cli.models import load_tokenizer

    tok = load_tokenizer(ensure_zoo("micro").target, "target")
    s0 = scenarios.build_stream("code", "test", tok, max_prompts=3)
    s1 = scenarios.build_stream("code", "test", tok, max_prompts=3, shuffle=1)
    s1b = scenarios.build_stream("code", "test", tok, max_prompts=3, shuffle=1)
    assert [p.ids for p in s1.prompts] == [p.ids for p in s1b.prompts]    # a shuffle is reproducible
    assert [p.ids for p in s0.prompts] != [p.ids for p in s1.prompts]
    assert s1.meta["shuffle"] == 1


# --- end to end on the micro zoo --------------------------------------------------------------

MICRO = """version = 1
description = "a micro claims suite"
[base]
zoo = "micro"
max_prompts = 1
max_new_tokens = 12
control = false
[grid]
shuffle = [1, 2, 3]
[axes.experiment]
indist = { scenario = "indist", methods = "vanilla" }
code = { scenario = "code", methods = "vanilla,drift,pld,suffix" }
[claims]
repeat = ["shuffle"]
[[claim]]
id = 1
title = "shift drops alpha"
seed = "000_fee7b5e6130b3396.txt"
quote = "vanilla acceptance fell"
copying = { experiment = "code" }
gain = true
[[claim.part]]
label = "indist - code"
figure = "a - b"
a = { where = { experiment = "indist" }, metric = "methods.vanilla.acceptance_rate" }
b = { where = { experiment = "code" }, metric = "methods.vanilla.acceptance_rate" }
side = "above"
threshold = 0.0
[[claim]]
id = 2
title = "batching"
seed = "004_43ee447c85fbbb1f.txt"
quote = "the speedup shrinks"
pending = "batching has not landed"
[[claim.part]]
label = "b8 - b1"
figure = "a - b"
a = { where = { experiment = "code", batch_size = "8" }, metric = "methods.vanilla.speedup" }
b = { where = { experiment = "code" }, metric = "methods.vanilla.speedup" }
side = "below"
threshold = 0.0
[[claim]]
id = 3
title = "two draft sizes"
seed = "004_43ee447c85fbbb1f.txt"
quote = "A larger draft accepts more"
pending = "the micro zoo has one draft per target"
"""


@pytest.mark.slow      # 27 micro cells end to end; .ci/run runs the claims quick variant too
def test_claims_report_end_to_end_on_micro(tmp_path, capsys):
    suite_file = tmp_path / "mc.toml"
    suite_file.write_text(MICRO)
    out = tmp_path / "results"
    md = tmp_path / "docs" / "claims.md"
    # before anything ran: every row says not measured, with the reason
    code, _, err = run_cli(["suite", "report", str(suite_file), "--claims", "--out", str(out),
                            "--claims-out", str(md)], capsys)
    assert code == 0, err
    assert md.read_text().count("have not run") >= 1
    # claim 1's cells only
    code, stdout, err = run_cli(["suite", "run", str(suite_file), "--claim", "1", "--out", str(out), "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(stdout)["executed"]) == 6
    code, stdout, err = run_cli(["suite", "report", str(suite_file), "--claims", "--out", str(out),
                                 "--claims-out", str(md), "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["report"] == str(md)
    text = md.read_text()
    rule, table = text.index("**The verdict rule.**"), text.index("| # |")
    assert rule < table and not re.search(r"\d\.\d{3}", text[:rule])   # the rule comes before any number
    row1 = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert "(*Speculative Decoding Under Distribution Shift: DRIFT Recalibration*)" in row1 and "vanilla acceptance fell" in row1
    m = re.search(r"indist - code \(> 0\): (-?\d\.\d+) \[(-?\d\.\d+), (-?\d\.\d+)\], n = 3 → (\w+)", row1)
    assert m, row1
    mean, lo, hi, v = float(m[1]), float(m[2]), float(m[3]), m[4]
    assert lo <= mean <= hi and v == C.verdict((lo, hi), "above", 0.0)
    assert "pld α" in row1 and "suffix α" in row1 and "4-gram share" in row1          # the copying control
    assert f"drift suite run {suite_file} --claim 1 --jobs 2" in row1
    assert (md.parent / "claims" / "claim-01.png").stat().st_size > 0
    row2 = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "not measured yet" in row2 and "batching has not landed" in row2 and "verdict: not measured" in row2
    # the figures are the cells' own numbers: recompute part (a) from the run.json files
    from drift_cli.metrics import seed_mean_ci95
    from drift_cli.suite import store
    suite = load_suite(suite_file)
    root = store.suite_dir(out, suite)
    per = {}
    for c in suite.cells:
        r = store.load_cell(root, c.key)
        per.setdefault(c.coord("shuffle"), {})[c.coord("experiment")] = r["methods"]["vanilla"]["acceptance_rate"]
    values = [p["indist"] - p["code"] for _, p in sorted(per.items())]
    want_mean, (want_lo, want_hi) = seed_mean_ci95(values)
    assert (mean, lo, hi) == pytest.approx((want_mean, want_lo, want_hi), abs=1e-3)


def test_settings_added_later_keep_older_cell_keys():
    from drift_cli.suite.spec import cell_key

    old = {"zoo": "micro", "seed": 0, "options": {"gain": None}}
    assert cell_key({**old, "shuffle": 0, "options": {"gain": None, "offline_on_policy": None}}) == cell_key(old)
    assert cell_key({**old, "shuffle": 2}) != cell_key(old)
    assert cell_key({**old, "options": {"gain": None, "offline_on_policy": True}}) != cell_key(old)


def test_offline_on_policy_reaches_the_zoo(monkeypatch):
    from drift_cli.methods.base import MethodContext
    from drift_cli.methods.offline import Offline, OfflineConfig

    asked = []
    ctx = MethodContext(draft=None, draft_path=Path("."), draft_fingerprint=None, eos_id=None, vocab_size=8,
                        configs={OfflineConfig: OfflineConfig(on_policy=True)},
                        resolve_offline=lambda div, on_policy: asked.append((div, on_policy)) or Path("/nowhere"),
                        load_draft=lambda path: None)
    monkeypatch.setattr(Offline, "__init__", lambda self, draft: None)
    Offline.build(ctx)
    assert asked == [("fkl", True)]


def test_a_cell_keeps_its_key_from_before_batching_controllers_and_switches(tmp_path):
    """A golden key, computed by the code before --batch-size, --gamma-policy, --switch-target-*,
    --shuffle and --offline-on-policy existed: at their defaults those settings stay out of the key,
    so the cells a suite wrote earlier are still found."""
    from drift_cli.suite.spec import load_suite

    suite = tmp_path / "s.toml"
    suite.write_text('version = 1\n[base]\nzoo = "micro"\nmax_prompts = 2\nmax_new_tokens = 8\n'
                     '[axes.workload]\ncode = { scenario = "code", methods = "vanilla,drift" }\n')
    assert load_suite(suite).cells[0].key == "614940c4716a"


def test_draft_size_cells_plan_the_variant_zoo():
    """claim 13's cells run on smollm's draft-size variant (and not on small, excluded), and the
    build plan asks for that zoo, so parallel cells never build it twice."""
    from drift_cli.suite.executors import build_plan

    suite = load_suite(CLAIMS_SUITE)
    d4 = [c for c in suite.cells if c.settings.get("draft_layers") == 4]
    assert {c.coord("experiment") for c in d4} == {"indist_d4", "code_d4"}
    assert {c.coord("zoo") for c in d4} == {"smollm"} and len(d4) == 6
    assert build_plan(d4)["zoos"] == ["smollm-d4"]
    plain = [c for c in suite.cells if c.coord("experiment") == "indist"]
    assert "smollm-d4" not in build_plan(plain)["zoos"]


def test_columns_may_combine_settings():
    """columns = ["zoo", "drafter"]: a column per combination ("micro / eagle"), each read alone."""
    cells, runs = [], {}
    for i in (1, 2, 3):
        for drafter, lift in (("layer", 0.2), ("eagle", -0.2)):
            for exp in ("a", "base"):
                key = f"{exp}{i}{drafter}"
                cells.append(Cell(key, (("shuffle", str(i)), ("drafter", drafter), ("experiment", exp)),
                                  {"zoo": "micro", "shuffle": i, "options": {}}))
                runs[key] = _run(0.4, 0.4 + lift + i / 1000) if exp == "a" else _run(0.4, 0.0)
    suite = Suite("hand", Path("hand.toml"), "", ("shuffle", "drafter", "experiment"), tuple(cells))
    spec = replace(_spec("above", 0.0), columns=("zoo", "drafter"))
    columns, [res] = C.assess(suite, spec, runs)
    assert columns == ["micro / layer", "micro / eagle"]
    assert res.verdicts == {"micro / layer": "confirmed", "micro / eagle": "refuted"}
    assert C.columns_text(spec) == "`zoo` / `drafter` settings" and C.columns_text(_spec("above", 0)) == "`zoo` setting"
    with pytest.raises(BadInput, match="columns"):
        C.parse_claims({"claims": {"columns": [3]}, "claim": [{"id": 1, "title": "t", "seed": "s", "quote": "q",
                                                              "pending": "p"}]}, Path("x.toml"))


def test_the_head_runs_the_cells_of_claims_1_3_10_and_16_on_the_real_pair_only():
    suite = load_suite(CLAIMS_SUITE)
    spec = C.load_claims(suite)
    heads = [c for c in suite.cells if c.coord("drafter") == "eagle"]
    assert heads and {c.coord("zoo") for c in heads} == {"smollm"}
    for cid in (1, 3, 10, 16):
        assert any(c.coord("drafter") == "eagle" for c in C.claim_cells(suite, spec, cid))
    needed = {c.key for cid in (1, 3, 10, 16) for c in C.claim_cells(suite, spec, cid)}
    assert {c.key for c in heads} <= needed          # no head cell that those claims do not read


def test_a_report_of_some_claims(tmp_path, capsys):
    code, _, err = run_cli(["suite", "report", str(CLAIMS_SUITE), "--claim", "3", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--claim picks claims of the claims report" in err
    code, _, err = run_cli(["suite", "report", str(CLAIMS_SUITE), "--claims", "--claim", "99", "--out", str(tmp_path),
                            "--claims-out", str(tmp_path / "c.md")], capsys)
    assert code == 2 and "claim" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["suite", "report", str(CLAIMS_SUITE), "--claims", "--claim", "3", "--claim", "17",
                            "--only", "zoo=smollm", "--out", str(tmp_path), "--claims-out", str(tmp_path / "c.md")],
                           capsys)
    assert code in (0, None), err
    text = (tmp_path / "c.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2:4].strip().isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 3", "| 17"]
    assert "--only zoo=smollm --claim 3 --claim 17 --claims" in text
    assert "smollm / layer: figure" in text and "smollm / eagle: figure" in text and "small /" not in text
