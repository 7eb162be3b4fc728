"""`drift ablate` and `drift analyze residuals` end to end on a tiny saved pair and a real corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drift_cli.cli import main
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return saved_pair(tmp_path_factory.mktemp("pair"))


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def common(pair, out):
    d, t = pair
    return ["--corpus", str(CORPUS), "--draft", str(d), "--target", str(t), "--max-prompts", "2",
            "--max-new-tokens", "12", "--out", str(out), "--json"]


def test_ablate_sweeps_an_axis_and_saves_a_run(pair, tmp_path, capsys):
    code, out, err = run_cli(["ablate", "--sweep", "lambda", "--values", "0,0.6", "--tau", "0.2",
                              *common(pair, tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(out)
    ab = run["ablation"]
    assert ab["axis"] == "lambda" and ab["option"] == "gain" and ab["values"] == [0.0, 0.6]
    assert [r["value"] for r in ab["rows"]] == [0.0, 0.6]
    assert set(run["methods"]) == {"ar", "vanilla", "drift[lambda=0.0]", "drift[lambda=0.6]"}
    # λ = 0 drafts exactly like vanilla; every drift run is lossless
    assert run["methods"]["drift[lambda=0.0]"]["acceptance_rate"] == run["methods"]["vanilla"]["acceptance_rate"]
    assert all(m["ar_match_rate"] == 1.0 for m in run["methods"].values() if m["ar_match_rate"] is not None)
    run_dir = tmp_path / run["scenario"] / run["run_id"]
    assert (run_dir / "ablation-lambda.png").stat().st_size > 0
    assert json.loads((run_dir / "run.json").read_text())["ablation"]["rows"] == ab["rows"]


def test_ablate_key_runs_draft_and_target_est(pair, tmp_path, capsys):
    code, out, err = run_cli(["ablate", "--sweep", "key", *common(pair, tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(out)
    rows = run["ablation"]["rows"]
    assert [r["value"] for r in rows] == ["draft", "target-est"] and run["ablation"]["skipped"] == {}
    assert all("skipped" not in r and 0.0 <= r["acceptance_rate"] <= 1.0 for r in rows)
    te = run["methods"]["drift[key=target-est]"]
    assert te["ar_match_rate"] == 1.0
    assert te["report"]["key_map"]["tenants"]["default"]["pairs"] > 0     # the map collected its pairs


def test_ablate_gamma_policy_runs_each_method_at_each_policy(pair, tmp_path, capsys):
    code, out, err = run_cli(["ablate", "--sweep", "gamma-policy", "--values", "fixed:1,fixed,hf,cost",
                              "--methods", "vanilla,pld", "--gamma", "3", *common(pair, tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(out)
    ab = run["ablation"]
    assert ab["axis"] == "gamma-policy" and ab["methods"] == ["vanilla", "pld"]
    assert [(r["method"], r["value"]) for r in ab["rows"]] == [
        (m, v) for m in ("vanilla", "pld") for v in ("fixed:1", "fixed", "hf", "cost")]
    methods = run["methods"]
    assert set(methods) == {"ar"} | {f"{m}[gamma-policy={v}]" for m in ("vanilla", "pld")
                                     for v in ("fixed:1", "fixed", "hf", "cost")}
    assert all(m["ar_match_rate"] == 1.0 for m in methods.values())
    # fixed:1 drafts one token per iteration, fixed the run's --gamma 3
    one, three = methods["vanilla[gamma-policy=fixed:1]"], methods["vanilla[gamma-policy=fixed]"]
    assert one["gamma_histogram"] == [0, one["iterations"], 0, 0]
    assert three["gamma_histogram"] == [0, 0, 0, three["iterations"]]
    assert methods["vanilla[gamma-policy=cost]"]["report"]["gamma_controller"]["policy"] == "cost"
    assert len(run["cost_profile"]["verify_ms"]) == 4


@pytest.mark.parametrize("args,message", [
    (["ablate", "--sweep", "gamma-policy", "--values", "fixed,greedy"], "--gamma-policy must be one of fixed, hf"),
    (["ablate", "--sweep", "gamma-policy", "--values", "fixed:0"], "the γ after ':' must be an integer >= 1"),
    (["ablate", "--sweep", "gamma-policy", "--methods", "ar"], "--methods names no drafting method"),
    (["bench", "--gamma-policy", "fast"], "Invalid value for '--gamma-policy'"),
    (["bench", "--gamma-p-min", "1.5"], "--gamma-p-min': must be in [0, 1], got 1.5"),
    (["ablate", "--sweep", "lamda"], "unknown ablation axis 'lamda' (did you mean 'lambda'?)"),
    (["ablate", "--sweep", "eta", "--values", "0.1,fast"], "--values for axis eta: --eta: 'fast' is not a valid float"),
    # --values go through the knob's own check, as the flag does (before any model loads)
    (["ablate", "--sweep", "lambda", "--values", "nan"], "--values for axis lambda: --gain must be in [0, 100] (λβ is added to the draft's logits), got nan"),
    (["ablate", "--sweep", "eta", "--values", "-1"], "--values for axis eta: --eta must be in (0, 1], got -1.0"),
    (["ablate", "--sweep", "key", "--values", "draft,bogus"], "--key must be one of draft, target-est, got 'bogus'"),
    (["ablate", "--sweep", "bank-size", "--values", "10000000000"], "--bank-size must be in [1, 67108864]"),
    (["ablate", "--sweep", "eta", "--gain", "inf"], "Invalid value for '--gain': must be in [0, 100] (λβ is added to the draft's logits), got inf"),
    (["bench", "--bank-size", "10000000000"], "Invalid value for '--bank-size': must be in [1, 67108864]"),
    (["bench", "--gain", "inf"], "Invalid value for '--gain': must be in [0, 100] (λβ is added to the draft's logits), got inf"),
    (["bench", "--osd-interval", "2.5"], "--osd-interval': must be a whole number >= 1 or inf, got 2.5"),
    (["analyze", "residuals", "--max-residuals", "1"], "--max-residuals must be at least 2"),
    (["bench", "--residuals", "-1"], "Invalid value for '--residuals': must be >= 0, got -1"),
])
def test_bad_input(args, message, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_analyze_residuals(pair, tmp_path, capsys):
    code, out, err = run_cli(["analyze", "residuals", *common(pair, tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(out)
    sp = run["analysis"]["spectrum"]
    assert sp["residuals"] >= 2 and sp["vocab"] == 300
    for name in ("uncentred", "centred"):
        energy = sp[name]["cumulative_energy"]
        assert all(a <= b + 1e-12 for a, b in zip(energy, energy[1:]))      # cumulative
        assert 0 < sp[name]["energy_top16"] <= 1.0 + 1e-9
        assert energy[min(15, len(energy) - 1)] == pytest.approx(sp[name]["energy_top16"])
    assert set(run["analysis"]["acceptance_by_entropy"]) == {"vanilla", "drift"}
    run_dir = tmp_path / run["scenario"] / run["run_id"]
    assert (run_dir / "residuals.png").stat().st_size > 0 and (run_dir / "entropy.png").stat().st_size > 0


def test_bench_records_the_same_residual_spectrum_as_analyze(pair, tmp_path, capsys):
    """`bench --residuals N` (what a suite cell runs) and `analyze residuals --max-residuals N`
    keep the same residuals on the same stream: the same spectrum, in vanilla's report; the cap holds."""
    code, out, err = run_cli(["analyze", "residuals", "--no-drift", "--max-residuals", "12", "--json",
                              *common(pair, tmp_path)], capsys)
    assert code == 0, err
    analysed = json.loads(out)["analysis"]["spectrum"]
    code, out, err = run_cli(["bench", "--methods", "vanilla", "--no-control", "--residuals", "12", "--json",
                              *common(pair, tmp_path / "bench")], capsys)
    assert code == 0, err
    benched = json.loads(out)["methods"]["vanilla"]["report"]["residual_spectrum"]
    assert benched["residuals"] == analysed["residuals"] == 12
    for name in ("uncentred", "centred"):
        assert benched[name]["singular_values"] == pytest.approx(analysed[name]["singular_values"], rel=1e-9)
    code, out, err = run_cli(["bench", "--methods", "vanilla", "--no-control", "--json", *common(pair, tmp_path / "off")],
                             capsys)
    assert code == 0, err
    assert "residual_spectrum" not in json.loads(out)["methods"]["vanilla"]["report"]   # off by default


@pytest.mark.parametrize("args", [["ablate", "--sweep", "lambda", "--values", "0,0.6"], ["analyze", "residuals"]])
def test_every_row_decodes_under_the_bench_timing_conditions(pair, tmp_path, capsys, monkeypatch, args):
    """ablate and analyze run their rows through bench's loop: each row with the collector's heap frozen,
    and envelopes with the same blocks as a bench run."""
    import gc

    from drift_cli import bench

    frozen: list[bool] = []
    real = bench.run_stream

    def spy(*a, **k):
        frozen.append(gc.get_freeze_count() > 0)
        return real(*a, **k)

    monkeypatch.setattr(bench, "run_stream", spy)
    code, out, err = run_cli([*args, *common(pair, tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(out)
    assert len(frozen) == len(run["methods"]) and all(frozen)
    assert {"schema_version", "env", "models", "seeds", "stream", "config"} <= set(run)
    assert run["stream"]["identity"] and run["config"]["prompts"] == 2
