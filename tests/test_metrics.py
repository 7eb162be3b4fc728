"""Each metric formula against hand-computed values."""

from __future__ import annotations

import math

import pytest

from drift_cli import metrics as M
from drift_cli.engine.loop import Generation, StepRecord


def step(drafted, accepted, total=10.0, draft=4.0, verify=5.0, adapt=0.0, adjust=0.0, ent=None, prompt=0, emitted=None):
    return StepRecord(prompt, 0, drafted, accepted, accepted + 1 if emitted is None else emitted, total, draft, verify,
                      adapt, total - draft - verify - adapt, adjust, draft * 0.8, verify * 0.9,
                      ent if ent is not None else [1.0] * drafted)


STEPS = [step(4, 4), step(4, 1), step(4, 0), step(2, 2), step(0, 0)]


def test_acceptance_rate_and_lengths():
    assert M.acceptance_rate(STEPS) == pytest.approx(7 / 14)
    assert M.acceptance_rate([step(0, 0)]) is None
    assert M.mean_accepted_drafts(STEPS) == pytest.approx(7 / 5)
    assert M.mean_accepted_length(STEPS) == pytest.approx(1 + 7 / 5)


def test_acceptance_by_position_and_histogram():
    # position 1: drafted in 4 steps, accepted in 3 (4,1,2); position 3: drafted in 3, accepted in 1
    assert M.acceptance_by_position(STEPS, 4) == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])
    assert M.accept_length_histogram(STEPS, 4) == [1, 1, 1, 0, 1]


def test_throughput_quantiles_overhead():
    steps = [step(4, 2, total=10.0, adapt=1.0, adjust=0.5), step(4, 2, total=30.0, adapt=1.0, adjust=0.5)]
    assert M.tokens_per_s(steps) == pytest.approx(6 / 40 * 1e3)
    assert M.step_ms_quantile(steps, 0.5) == pytest.approx(20.0)
    assert M.overhead_ms_per_step(steps) == pytest.approx(1.5)
    assert M.overhead_pct(steps) == pytest.approx(100 * 3 / 40)
    # outside forwards: 40 - (0.8*4*2 + 0.9*5*2)
    assert M.harness_overhead_pct(steps) == pytest.approx(100 * (40 - 6.4 - 9.0) / 40)


def test_predicted_speedup_formula():
    # alpha 0.5, gamma 4, c 0.1: (1 - 0.5^5) / (0.5 * 1.4)
    assert M.predicted_speedup(0.5, 4, 0.1) == pytest.approx((1 - 0.5**5) / (0.5 * 1.4))
    assert M.predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert M.predicted_speedup(0.0, 4, 0.25) == pytest.approx(0.5)
    assert M.predicted_speedup(None, 4, 0.1) is None


def test_cost_ratio():
    ar = [step(0, 0, total=8.0)] * 3
    assert M.cost_ratio([step(4, 2, draft=4.0)], ar) == pytest.approx((4.0 / 4) / 8.0)


def _gen(i, out, ms_per_token, prompt=(1, 2, 3)):
    n = len(out)
    return Generation(i, list(prompt), list(out), [step(0, 0, total=ms_per_token * n, emitted=n)], 1.0, False)


def test_paired_speedup_and_bootstrap():
    ar = [_gen(0, [1] * 10, 10.0), _gen(1, [1] * 10, 10.0)]
    fast = [_gen(0, [1] * 10, 5.0), _gen(1, [1] * 10, 2.5)]
    sp = M.paired_speedup(fast, ar)
    assert sp["speedup_per_prompt"] == pytest.approx([2.0, 4.0])
    assert sp["speedup"] == pytest.approx(3.0)
    lo, hi = sp["speedup_ci95"]
    assert 2.0 <= lo <= 3.0 <= hi <= 4.0
    assert M.paired_speedup(fast[:1], ar) is None  # no silent truncation of unpaired runs
    lo, hi = M.bootstrap_ci([1.0] * 50)
    assert lo == hi == 1.0


def test_alpha_curve_and_convergence():
    steps = [step(4, 0)] * 100 + [step(4, 4)] * 300
    curve = M.alpha_curve(steps, window=50, stride=50)
    assert curve[0] == (50, 0.0) and curve[-1] == (400, 1.0)
    # windows ending at 150 still include 50 rejecting steps (alpha 0.0); from 150 on all are 1.0
    assert M.convergence_steps(curve) == 150
    assert M.convergence_steps(curve[:3]) is None


def test_alpha_by_half_pairs_the_stream_halves_by_prompt():
    from drift_cli.engine.loop import Generation

    def gen(i, accepted):
        return Generation(prompt_index=i, prompt_ids=[1], output_ids=[2], steps=[step(4, a) for a in accepted],
                          prefill_ms=0.0, hit_eos=False)

    # finished out of order (a batched stream): the halves follow the prompt index, not the list
    gens = [gen(2, [4, 4]), gen(0, [0, 1]), gen(3, [2]), gen(1, [1])]
    assert M.alpha_by_half(gens) == [2 / 12, 10 / 12]
    assert M.alpha_by_half([gen(0, [4])]) == [None, 1.0]
    assert M.alpha_by_half([]) == [None, None]


def test_acceptance_by_entropy():
    steps = [step(2, 1, ent=[0.1, 2.5]), step(2, 2, ent=[0.2, 0.7])]
    buckets = M.acceptance_by_entropy(steps)
    by_lo = {b["entropy_lo"]: b for b in buckets}
    assert by_lo[0.0]["drafted"] == 2 and by_lo[0.0]["acceptance_rate"] == 1.0
    assert by_lo[0.5]["acceptance_rate"] == 1.0 and by_lo[2.0]["acceptance_rate"] == 0.0
    assert by_lo[3.0]["acceptance_rate"] is None


def test_ar_match_rate():
    ar = [_gen(0, [1, 2], 1.0), _gen(1, [3, 4], 1.0)]
    assert M.ar_match_rate([_gen(0, [1, 2], 1.0), _gen(1, [3, 5], 1.0)], ar) == 0.5
    assert M.ar_match_rate(ar, ar) == 1.0


def test_stream_statistics_repeats_across_prompts():
    g0 = _gen(0, [1, 2, 3, 4, 1, 2, 3, 4], 1.0, prompt=(9,))
    g1 = _gen(1, [1, 2, 3, 4], 1.0, prompt=(8,))
    s = M.stream_statistics([g0, g1])
    # g0 output 4-grams (9,1,2,3) (1,2,3,4) (2,3,4,1) (3,4,1,2) (4,1,2,3) (1,2,3,4)* (pos of first token: too short)
    # tokens counted: in g0 positions 3..8 (6 grams), 1 repeated; in g1 positions 3..4 (2 grams: (8,1,2,3) (1,2,3,4)*)
    assert s["repeated_ngram_share"] == pytest.approx(2 / 8)
    assert s["distinct_4"] == pytest.approx(6 / 8)
    assert s["output_tokens"] == 12 and s["mean_output_length"] == 6.0


def test_shift_penalty_and_gap_closed():
    assert M.shift_penalty(2.5, 1.6) == pytest.approx(0.9 / 1.5)
    assert M.shift_penalty(1.0, 0.9) is None
    assert M.shift_penalty(0.8, 0.3) is None  # no in-distribution gain: nothing to lose
    assert M.gap_closed(0.63, 0.42, 0.66) == pytest.approx(0.21 / 0.24)
    assert M.gap_closed(0.5, 0.5, 0.5) is None
    assert math.isclose(M.gap_closed(2.3, 1.6, 2.5), 0.7 / 0.9)
