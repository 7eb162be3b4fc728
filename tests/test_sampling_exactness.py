"""Sampling losslessness: the speculative output distribution equals the target's.

A chi-square test (significance 1e-3, ~3000 samples of the first two tokens, vocabulary 8)
must accept the engine's output for vanilla and for a biased proposal (at a fixed γ and under
the hf, ema and confidence γ controllers, whose state persists across the samples), and must
reject a deliberately wrong rule that uses the unbiased q in the acceptance ratio of a biased
proposal (at a fixed γ and under a controller).
"""

from __future__ import annotations

import pytest
import torch

from drift_cli.engine.gamma import GammaConfig
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import ModelDraftPolicy, Proposal
from drift_cli.methods.vanilla import Vanilla
from tests.exactness import SIGNIFICANCE, sampling_p_value
from tests.models import tiny_pair

VOCAB = 8
PROMPT = [1, 5, 2]


class Biased(ModelDraftPolicy):
    """Adds a fixed bias to the draft's logits (as DRIFT does) and reports the biased q."""

    name = "biased"

    def adjust(self, hidden, logits, sampler):
        return logits + torch.tensor([3.0, 0, 0, 0, 0, 0, 0, -2.0])


class Mixed(ModelDraftPolicy):
    """A bias that depends on the draft's own state: strong (top probability ~0.76) where the draft's
    raw argmax is even, none elsewhere, so that a confidence stop at p_min 0.5 cuts some
    proposals early and leaves others whole."""

    name = "mixed"

    def adjust(self, hidden, logits, sampler):
        even = (logits.argmax(-1, keepdim=True) % 2 == 0).float()
        return logits + even * torch.tensor([3.0, 0, 0, 0, 0, 0, 0, -2.0])


class WrongRule(Biased):
    """Samples from the biased q' but hands the engine the unbiased q: not exact any more."""

    name = "wrong"

    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        unbiased = sampler.probs(sampler.sampling_logits(prop.base_logits))
        return Proposal(prop.tokens, unbiased, prop.hidden, prop.base_logits, prop.num_draft)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=VOCAB, seed=11)


@pytest.mark.stats
@pytest.mark.parametrize(
    "policy,kw",
    [
        (Vanilla, {}),
        (Biased, {}),
        (Biased, {"temperature": 0.7, "top_p": 0.9}),
        (Autoregressive, {}),
        (Biased, {"gamma_policy": GammaConfig(policy="hf"), "gamma": 4}),
        (Biased, {"gamma_policy": GammaConfig(policy="ema", ema_rate=0.5), "gamma": 4}),
        (Mixed, {"gamma_policy": GammaConfig(policy="confidence", p_min=0.5), "gamma": 4}),
        (Mixed, {"gamma_policy": GammaConfig(policy="confidence", p_min=0.5), "gamma": 4, "temperature": 0.7,
                 "top_p": 0.9}),
    ],
    ids=["vanilla", "biased", "biased-T0.7-top_p0.9", "ar", "biased-hf", "biased-ema", "mixed-confidence",
         "mixed-confidence-T0.7-top_p0.9"],
)
def test_speculative_sampling_matches_target(pair, policy, kw):
    draft, target = pair
    make = (lambda: policy(draft)) if policy is not Autoregressive else Autoregressive
    p = sampling_p_value(target, make, PROMPT, samples=3000, **kw)
    assert p > SIGNIFICANCE, f"output distribution differs from the target's (p = {p:.2e})"


def test_mixed_bias_makes_confidence_stop_sometimes(pair):
    """The confidence cases above exercise both branches: early stops and whole proposals."""
    draft, _ = pair
    policy, sampler = Mixed(draft), Sampler(1.0, None, torch.Generator().manual_seed(0))
    policy.p_min = 0.5
    ks = set()
    for first in range(8):
        context = torch.tensor([PROMPT + [first]])
        policy.begin_prompt(context)
        ks.add(policy.propose(context, 4, sampler).k)
    assert 4 in ks and len(ks) > 1, ks


@pytest.mark.stats
@pytest.mark.parametrize("policy", ["fixed", "hf"])
def test_wrong_rule_is_detected(pair, policy):
    draft, target = pair
    p = sampling_p_value(target, lambda: WrongRule(draft), PROMPT, samples=3000,
                         gamma_policy=GammaConfig(policy=policy))
    assert p < SIGNIFICANCE, f"the wrong acceptance rule went unnoticed (p = {p:.3f})"


# -- batch 4: continuous batching over a stream of copies of the prompt (ragged rows, per-row rollback)


def _moving_drift(draft, moved: list, **kw):
    """DRIFT with a non-zero bias, recording whether the bias moved each draft step's logits."""
    from drift_cli.drift.config import DriftConfig
    from drift_cli.methods.drift import DriftMethod

    m = DriftMethod(draft, DriftConfig(gain=3.0, tau=0.0, sigma=1.0, bank_size=16, support=4), **kw)
    adjust = m.adjust

    def spy(h, z, sampler):
        out = adjust(h, z, sampler)
        moved.append(not torch.equal(out, z))
        return out
    m.adjust = spy
    return m


@pytest.mark.stats
@pytest.mark.parametrize("policy", ["vanilla", "drift", "drift-reference"])
def test_sampling_is_exact_at_batch_4(pair, policy):
    from tests.drift_books import make_books

    draft, target = pair
    moved: list[bool] = []
    make = {"vanilla": lambda: Vanilla(draft),
            "drift": lambda: _moving_drift(draft, moved),
            "drift-reference": lambda: _moving_drift(draft, moved, books_factory=make_books, backend="reference")}[policy]
    p = sampling_p_value(target, make, PROMPT, samples=3000, batch=4)
    if policy != "vanilla":
        assert sum(moved) > len(moved) // 2        # most proposals were drawn from a biased q'
    assert p > SIGNIFICANCE, f"output distribution at batch 4 differs from the target's (p = {p:.2e})"


@pytest.mark.stats
def test_wrong_rule_is_detected_at_batch_4(pair):
    draft, target = pair
    p = sampling_p_value(target, lambda: WrongRule(draft), PROMPT, samples=3000, batch=4)
    assert p < SIGNIFICANCE, f"the wrong acceptance rule went unnoticed at batch 4 (p = {p:.3f})"
