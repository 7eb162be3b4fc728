"""Method flags that would do nothing, and values past what any run can reach: each is refused in
one line (exit 2) before a model loads, as --gain without drift is; a value at the bound is
accepted and does what the docs say."""

from __future__ import annotations

import pytest

from drift_cli.bench_config import BenchConfig
from drift_cli.cli import main
from drift_cli.errors import BadInput


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def bench(out, *extra):
    return ["bench", "--zoo", "micro", "--max-prompts", "2", "--max-new-tokens", "8", "--no-control", "--out", out,
            *extra]


HYBRID = ("--methods", "hybrid")

# (id, extra argv(tmp), message fragment)
UNREAD = [
    ("min-length under the score rule", lambda T: [*HYBRID, "--hybrid-rule", "score", "--hybrid-min-length", "3"],
     "--hybrid-min-length is only used by the length hybrid rule, which --hybrid-rule score does not select"),
    ("min-length under the default rule", lambda T: [*HYBRID, "--hybrid-min-length", "3"],
     "--hybrid-min-length is only used by the length hybrid rule"),
    ("min-score under the length rule", lambda T: [*HYBRID, "--hybrid-rule", "length", "--hybrid-min-score", "1"],
     "--hybrid-min-score is only used by the score or learned hybrid rule, which --hybrid-rule length does not"),
    ("bank-out, a hybrid only", lambda T: [*HYBRID, "--bank-out", T / "b.safetensors"],
     "--bank-out is only used by the drift method, which --methods hybrid does not run"),
    ("bank-in missing, a hybrid only", lambda T: [*HYBRID, "--bank-in", T / "missing.safetensors"],
     "--bank-in is only used by the drift method, which --methods hybrid does not run"),
    ("learn-copied, vanilla model side", lambda T: [*HYBRID, "--hybrid-model", "vanilla", "--hybrid-learn-copied"],
     "--hybrid-learn-copied is only used by the drift or osd hybrid model source, which --hybrid-model vanilla"),
    ("no-learn-copied, offline model side", lambda T: [*HYBRID, "--hybrid-model", "offline",
                                                       "--hybrid-no-learn-copied"],
     "--hybrid-learn-copied is only used by the drift or osd hybrid model source"),
    ("gamma-policy with ar alone", lambda T: ["--methods", "ar", "--gamma-policy", "ema"],
     "--gamma-policy is only used by the vanilla, drift, offline, osd, pld, suffix and hybrid methods, which "
     "--methods ar does not run"),
    ("gamma-policy confidence knob with ar", lambda T: ["--methods", "ar", "--gamma-p-min", "0.5"],
     "--gamma-p-min is only used by the"),
]

BOUNDS = [
    ("min-length 2^63", lambda T: [*HYBRID, "--hybrid-rule", "length", "--hybrid-min-length", str(2**63)],
     f"--hybrid-min-length {2**63} exceeds --gamma 4: a copying draft's length is at most --gamma"),
    ("min-length 10^9", lambda T: [*HYBRID, "--hybrid-rule", "length", "--hybrid-min-length", "1000000000"],
     "--hybrid-min-length 1000000000 exceeds --gamma 4"),
    ("min-length past --gamma 6", lambda T: [*HYBRID, "--gamma", "6", "--hybrid-rule", "length",
                                             "--hybrid-min-length", "7"], "--hybrid-min-length 7 exceeds --gamma 6"),
    ("min-score 1e308", lambda T: [*HYBRID, "--hybrid-min-score", "1e308"],
     "--hybrid-min-score 1e+308 exceeds --gamma 4: a copying draft's expected accepted length is at most --gamma"),
    ("min-score learned rule", lambda T: [*HYBRID, "--hybrid-rule", "learned", "--hybrid-min-score", "4.5"],
     "--hybrid-min-score 4.5 exceeds --gamma 4"),
]


@pytest.mark.parametrize("case", UNREAD + BOUNDS, ids=[c[0] for c in UNREAD + BOUNDS])
def test_a_flag_that_does_nothing_or_can_never_hold_is_refused(case, tmp_path, capsys):
    _, extra, fragment = case
    code, out, err = run_cli(bench(tmp_path / "runs", *extra(tmp_path)), capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("options", [
    {"hybrid_rule": "length", "hybrid_min_length": 4},              # copies full-length drafts only
    {"hybrid_rule": "score", "hybrid_min_score": 4.0},
    {"hybrid_rule": "learned", "hybrid_min_score": 0.0},            # always copies where a draft exists
    {"hybrid_model": "osd", "hybrid_learn_copied": True},
    {"hybrid_model": "drift", "hybrid_learn_copied": False},
])
def test_a_hybrid_flag_its_rule_reads_within_gamma_is_accepted(options):
    BenchConfig(zoo="micro", methods="hybrid", gamma=4, options=options).validate()


def test_the_suite_check_sees_a_cells_selector(tmp_path, capsys):
    """A suite cell with hybrid_rule = "length" reads its hybrid_min_length (the selector is the
    cell's, not the default); under the score rule it is read by no cell."""
    base = 'version = 1\n[base]\nzoo = "micro"\nscenario = "jargon"\nmethods = "hybrid"\nmax_prompts = 1\n'
    ok = tmp_path / "ok.toml"
    ok.write_text(base + 'hybrid_rule = "length"\nhybrid_min_length = 3\n[grid]\nseed = [1, 2]\n')
    code, out, err = run_cli(["suite", "status", ok, "--out", tmp_path / "runs", "--json"], capsys)
    assert code == 0, err
    bad = tmp_path / "bad.toml"
    bad.write_text(base + 'hybrid_rule = "score"\nhybrid_min_length = 3\n[grid]\nseed = [1, 2]\n')
    code, out, err = run_cli(["suite", "status", bad, "--out", tmp_path / "runs"], capsys)
    assert code == 2 and "setting hybrid_min_length is read by no cell" in err, err


@pytest.mark.parametrize("rule,threshold", [("length", 4), ("score", 4.0)])
def test_at_the_bound_a_hybrid_copies_only_full_drafts_that_reach_it(rule, threshold):
    """A threshold equal to --gamma is accepted and means what docs/model_free.md says: a row
    copies only a full --gamma-token draft (score: one whose expected accepted length reaches
    --gamma, i.e. a certain one); a shorter or less certain draft goes to the model source."""
    from types import SimpleNamespace

    from drift_cli.methods.hybrid import Hybrid, _Pick
    from drift_cli.methods.settings import HybridConfig

    name = "min_length" if rule == "length" else "min_score"
    cfg = HybridConfig(rule=rule, **{name: threshold})
    cfg.check_gamma(4, {f"hybrid_{name}"})
    me = SimpleNamespace(cfg=cfg, rate={})
    assert Hybrid._copies(me, _Pick([1, 2, 3, 4], 4.0), 0)
    assert not Hybrid._copies(me, _Pick([1, 2, 3], 3.0), 0)
    assert not Hybrid._copies(me, _Pick([1, 2, 3, 4], 3.9), 0) or rule == "length"


def test_bounds_are_checked_without_a_model():
    with pytest.raises(BadInput, match="exceeds --gamma 4"):
        BenchConfig(zoo="micro", methods="hybrid", options={"hybrid_min_score": 1e308}).validate()
