"""Sampling on an EAGLE-3 head with a reduced draft vocabulary (d2t/t2d) is exact: the chi-square
test of tests/exactness.py at batch 4 with a non-zero DRIFT bias, and the wrong rule (the unbiased
q in the acceptance ratio of a biased proposal) still rejected."""

from __future__ import annotations

import pytest
import torch

from drift_cli.eagle.load import load_head
from drift_cli.engine.head import OUTSIDE
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.vanilla import Vanilla
from tests.eagle_writer import write_eagle3
from tests.exactness import SIGNIFICANCE, sampling_p_value
from tests.models import tiny_llama
from tests.test_sampling_exactness import PROMPT, VOCAB, WrongRule, _moving_drift

SUBSET = [0, 2, 3, 5, 7]          # the head drafts 5 of the 8 tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = tiny_llama(VOCAB, 48, 4, 11)
    head = load_head(write_eagle3(tmp_path_factory.mktemp("head"), target, draft_vocab=SUBSET, aux=[0, 2, 3], seed=5),
                     target)
    return head, target


def test_a_reduced_vocabulary_head_proposes_only_its_tokens(pair):
    """q is exactly 0 outside the draft vocabulary (logit OUTSIDE), so such a token is never drafted."""
    head, target = pair
    from drift_cli.engine.lm import CausalLM
    from drift_cli.engine.loop import DecodeConfig, run_stream
    from tests.recording import unit_stream

    seen = []

    class Seeing(Vanilla):
        def propose(self, context, gamma, sampler):
            prop = super().propose(context, gamma, sampler)
            seen.append(prop)
            return prop

    cfg = DecodeConfig(gamma=3, max_new_tokens=12, temperature=1.0, batch_size=4)
    run_stream(CausalLM(target, "target"), Seeing(head), unit_stream([PROMPT] * 8, 12), cfg)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    assert seen and all(set(p.tokens[b, :n].tolist()) <= set(SUBSET) for p in seen for b, n in enumerate(p.lengths))
    assert all(bool((p.base_logits[..., outside] == OUTSIDE).all()) for p in seen if p.k)
    assert all(float(p.q[..., outside].abs().max()) == 0.0 for p in seen if p.k)
    assert Sampler(1.0).probs(seen[0].base_logits)[..., SUBSET].sum(-1).allclose(torch.tensor(1.0))


@pytest.mark.stats
def test_sampling_on_a_head_with_a_drift_bias_is_exact_at_batch_4(pair):
    head, target = pair
    moved: list[bool] = []
    p = sampling_p_value(target, lambda: _moving_drift(head, moved), PROMPT, samples=3000, batch=4)
    assert sum(moved) > len(moved) // 2          # most proposals were drawn from a biased q'
    assert p > SIGNIFICANCE, f"output distribution on a head at batch 4 differs from the target's (p = {p:.2e})"


@pytest.mark.stats
def test_the_wrong_rule_on_a_head_is_detected_at_batch_4(pair):
    head, target = pair
    p = sampling_p_value(target, lambda: WrongRule(head), PROMPT, samples=3000, batch=4)
    assert p < SIGNIFICANCE, f"the wrong acceptance rule went unnoticed on a head (p = {p:.3f})"
