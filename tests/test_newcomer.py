"""What a first run shows: "gap closed" only where there is a gap beyond noise (n/a otherwise),
and progress lines on a stderr that is not a terminal (a log file, CI, nohup)."""

from __future__ import annotations

import json
import re

import pytest

from drift_cli import metrics
from drift_cli.bench import comparisons
from drift_cli.cli import main


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# ---------------------------------------------------------------- gap closed

def test_gap_closed_is_none_unless_the_gap_exceeds_its_noise():
    assert metrics.gap_closed(0.63, 0.42, 0.66, noise=0.1) == pytest.approx(0.21 / 0.24)
    assert metrics.gap_closed(0.63, 0.42, 0.66, noise=0.25) is None          # the gap is within noise: n/a
    assert metrics.gap_closed(0.63, 0.66, 0.42, noise=0.2) == pytest.approx(-0.03 / -0.24)   # a negative gap too
    assert metrics.gap_closed(0.63, 0.42, 0.66, noise=None) is None          # no CI: cannot tell
    assert metrics.difference_half_width([0.4, 0.6], [0.2, 0.26]) == pytest.approx((0.1 ** 2 + 0.03 ** 2) ** 0.5)
    assert metrics.difference_half_width(None, [0.2, 0.3]) is None


def block(alpha, alpha_ci, speedup, speedup_ci):
    return {"acceptance_rate": alpha, "acceptance_ci95": alpha_ci, "speedup": speedup, "speedup_ci95": speedup_ci}


def test_comparisons_store_null_for_a_gap_inside_its_ci_and_the_ratio_outside():
    """The micro run that printed 4.875: offline barely above vanilla, inside the CIs -> null."""
    noisy = {"vanilla": block(0.50, [0.40, 0.60], 1.50, [1.2, 1.8]),
             "offline": block(0.52, [0.42, 0.62], 1.55, [1.25, 1.85]),
             "drift": block(0.60, [0.50, 0.70], 1.80, [1.5, 2.1])}
    c = comparisons(noisy, None)
    assert c["gap_closed_alpha"] is None and c["gap_closed_speedup"] is None
    clear = {"vanilla": block(0.40, [0.38, 0.42], 1.50, [1.45, 1.55]),
             "offline": block(0.70, [0.68, 0.72], 2.50, [2.45, 2.55]),
             "drift": block(0.61, [0.59, 0.63], 2.20, [2.15, 2.25])}
    c = comparisons(clear, None)
    assert c["gap_closed_alpha"] == pytest.approx(0.7) and c["gap_closed_speedup"] == pytest.approx(0.7)
    json.dumps(c, allow_nan=False)


def test_the_report_prints_n_a_for_a_stored_null(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--zoo", "micro", "--methods", "vanilla", "--max-prompts", "1",
                              "--max-new-tokens", "4", "--no-control", "--out", tmp_path], capsys)
    assert code == 0, err
    path = next(tmp_path.rglob("run.json"))
    run = json.loads(path.read_text())
    assert run["comparisons"]["gap_closed_alpha"] is None            # no offline run: no gap to close
    run["comparisons"].update(gap_closed_alpha=None, gap_closed_speedup=0.5)
    path.write_text(json.dumps(run))
    code, out, err = run_cli(["report", path.parent], capsys)
    assert code == 0, err
    assert "gap closed (α) n/a" in out and "gap closed (speedup) 0.500" in out


# ---------------------------------------------------------------- progress without a TTY

LINE = re.compile(r"^(?P<what>\S+): (?P<done>\d+)/(?P<total>\d+) prompts, (?P<rate>[\d.]+|–) tok/s, ETA (\S+)$")


def test_a_bench_into_a_log_prints_plain_progress_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRIFT_PROGRESS_INTERVAL", "0.000001")       # every tick
    code, out, err = run_cli(["bench", "--zoo", "micro", "--methods", "vanilla", "--max-prompts", "3",
                              "--max-new-tokens", "8", "--no-control", "--out", tmp_path], capsys)
    assert code == 0, err
    lines = [m for ln in err.splitlines() if (m := LINE.match(ln.strip()))]
    assert {m["what"] for m in lines} >= {"jargon/ar", "jargon/vanilla"}, err
    last = [m for m in lines if m["what"] == "jargon/vanilla"][-1]
    assert (last["done"], last["total"]) == ("3", "3") and float(last["rate"]) > 0
    assert all("\x1b" not in ln for ln in err.splitlines())          # plain text, no terminal codes


def test_progress_lines_keep_to_their_interval(monkeypatch, capsys):
    from drift_cli import console

    clock = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: clock[0])
    monkeypatch.setenv("DRIFT_PROGRESS_INTERVAL", "30")
    with console.rich_progress() as bars:
        cb = console.ProgressCallback(bars)
        for done in range(0, 11):               # a prompt every 10 s, 20 tokens each
            cb("code/drift", done, 10, 20 * done)
            clock[0] += 10.0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["code/drift: 3/10 prompts, 2.0 tok/s, ETA 1m10s", "code/drift: 6/10 prompts, 2.0 tok/s, ETA 40s",
                     "code/drift: 9/10 prompts, 2.0 tok/s, ETA 10s"]


@pytest.mark.parametrize("value", ["off", "0", "-5", "nan"])
def test_progress_lines_can_be_turned_off(value, monkeypatch):
    from drift_cli import console

    monkeypatch.setenv("DRIFT_PROGRESS_INTERVAL", value)
    assert console.progress_interval() is None


def test_the_default_interval_is_thirty_seconds(monkeypatch):
    from drift_cli import console

    monkeypatch.delenv("DRIFT_PROGRESS_INTERVAL")
    assert console.progress_interval() == 30.0
