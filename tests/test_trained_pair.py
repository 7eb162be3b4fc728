"""Greedy losslessness on a trained pair (the micro zoo) and on its real prompt stream."""

from __future__ import annotations

import pytest

from drift_cli.bench import BenchConfig, Models, load_stream, resolve_scenario, run_methods, summarise
from drift_cli.models import load_pair
from drift_cli.zoo import ensure_zoo


@pytest.fixture(scope="module")
def micro():
    zp = ensure_zoo("micro")
    return Models(load_pair(zp.draft, zp.target), "micro")


@pytest.mark.parametrize("gamma", [2, 5])
def test_vanilla_equals_ar_on_trained_micro_pair(micro, gamma):
    cfg = BenchConfig(scenario="indist", split="dev", max_prompts=3, max_new_tokens=40, gamma=gamma)
    stream = load_stream(cfg, micro.pair.tokenizer, resolve_scenario(cfg))
    runs, _, _ = run_methods(["ar", "vanilla"], micro, stream, cfg)
    m = summarise(runs, cfg)
    assert m["vanilla"]["ar_match_rate"] == 1.0
    assert m["vanilla"]["acceptance_rate"] > 0.0            # a trained pair agrees some of the time
    assert m["vanilla"]["iterations"] < m["ar"]["iterations"]  # and so needs fewer target passes
