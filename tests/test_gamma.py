"""γ controllers: their γ sequences on hand-made accept patterns, the confidence stop inside the
draft loop, the cost model's formulas, and greedy losslessness of every controller with every
drafting method."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from drift_cli import metrics
from drift_cli.engine.gamma import (CostModel, CostProfile, GammaConfig, Tiered, Transformers, controller,
                                    profile_costs, tiers)
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import ModelDraftPolicy
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.stream import Prompt, Stream
from tests.models import tiny_llama, tiny_pair


def sequence(ctl, pattern):
    """γ after each (drafted, accepted) observation."""
    out = []
    for drafted, accepted in pattern:
        ctl.observe(drafted, accepted)
        out.append(ctl.next_gamma())
    return out


def test_hf_schedule():
    ctl = Transformers(6)
    assert ctl.next_gamma() == 6
    pattern = [(6, 6), (6, 3), (5, 1), (4, 4), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1), (0, 0)]
    assert sequence(ctl, pattern) == [6, 5, 4, 6, 5, 4, 3, 2, 1, 1, 3, 3]


def test_tiers():
    assert tiers(1) == [1]
    assert tiers(4) == [1, 2, 4]
    assert tiers(6) == [1, 2, 4, 6]
    assert tiers(8) == [1, 2, 4, 8]


def test_ema_tiers():
    ctl = Tiered(8, rate=0.5)
    assert ctl.next_gamma() == 8
    pattern = [(8, 8), (8, 0), (8, 0), (4, 0), (2, 0), (2, 0), (1, 1), (2, 2), (2, 2), (0, 0)]
    # EMA: 8, 4, 2, 1, .5, .25, .625, 1.3125, 1.65625 -> tier >= round(EMA) + 1
    assert sequence(ctl, pattern) == [8, 8, 4, 2, 2, 1, 2, 2, 4, 4]


PROFILE = CostProfile(verify_ms=(10.0, 11.0, 12.0, 13.0, 14.0), draft_ms_per_token=1.0)


def test_cost_controller_follows_acceptance():
    ctl = CostModel(4, PROFILE, decay=0.98)
    # prior α = 1/2 everywhere: 1/10 at k=0, 1.5/12 = 1.75/14 at k=1, 2 (ties go to the shorter)
    assert ctl.next_gamma() == 1
    for _ in range(30):                       # everything accepted: climbs to the cap
        g = ctl.next_gamma()
        ctl.observe(g, g)
    assert ctl.next_gamma() == 4
    for _ in range(60):                       # everything rejected: stops drafting
        g = ctl.next_gamma()
        ctl.observe(g, 0)
    assert ctl.next_gamma() == 0
    for _ in range(400):                      # the counts decay back to the prior: drafts again
        ctl.observe(0, 0)
        if ctl.next_gamma() > 0:
            break
    assert ctl.next_gamma() == 1


def test_cost_controller_uses_measured_costs():
    ctl = CostModel(4, PROFILE, decay=1.0)
    for _ in range(20):
        ctl.observe(4, 4)
    assert ctl.next_gamma() == 4
    # the same acceptance, but drafting now costs 60 ms a token: a plain target step wins
    slow = SimpleNamespace(draft_ms=240.0, forward_target_ms=14.0, total_ms=254.0)
    for _ in range(40):
        ctl.observe(4, 4, record=slow)
    assert ctl.next_gamma() == 0


def test_goodput_formula():
    assert metrics.expected_emitted([0.5, 0.5], 2) == pytest.approx(1.75)
    assert metrics.expected_emitted([1.0, 0.0, 1.0], 3) == pytest.approx(2.0)   # runs, not i.i.d.
    assert metrics.iteration_ms(3, 2.0, [5, 6, 7, 8], 1.0) == pytest.approx(15.0)
    assert metrics.goodput([0.5, 0.5], 2, 1.0, [10, 11, 12], 0.0) == pytest.approx(1.75 / 14)


def test_expected_tree_emitted():
    # one rank: the best n-node tree of depth >= n is the chain, as expected_emitted says
    chain = metrics.expected_tree_emitted([[0.8], [0.5], [0.5]], 3, 4)
    assert chain == pytest.approx([1.0] + [metrics.expected_emitted([0.8, 0.5, 0.5], k) for k in (1, 2, 3, 3)])
    # two ranks at depth 1 (a = 0.6, then 0.5 of the rest), 0.5 at depth 2:
    # node values 0.6 (rank 0), 0.3 (its child), 0.2 (rank 1: 0.4 x 0.5), 0.15 (rank-1 child of rank 0)
    tree = metrics.expected_tree_emitted([[0.6, 0.5], [0.5, 0.5]], 2, 5)
    assert tree == pytest.approx([1.0, 1.6, 1.9, 2.1, 2.25, 2.35])
    assert metrics.iteration_ms(2, 1.0, [5, 6, 7, 8, 9], 0.5, nodes=4) == pytest.approx(11.5)


def _tree_step(ranks, tried, verify_ms):
    return SimpleNamespace(nodes=8, ranks=ranks, tried=tried, gamma=3, draft_ms=3.0, forward_target_ms=verify_ms,
                           total_ms=3.0 + verify_ms)


def test_cost_controller_chooses_the_node_budget():
    """With scoring nearly free per node the budget climbs to --tree-nodes; when every extra
    node costs a tenth of a step, it stays small. The choice is the best (γ, n) of the rule
    (γ = 0: no tree), found by brute force."""
    flat = CostProfile(verify_ms=tuple([10.0] * 9), draft_ms_per_token=1.0)
    steep = CostProfile(verify_ms=tuple(10.0 + n for n in range(9)), draft_ms_per_token=1.0)
    picks = {}
    for name, profile in (("flat", flat), ("steep", steep)):
        ctl = CostModel(3, profile, decay=1.0, nodes_max=8, ranks=3)
        for _ in range(50):                     # rank 0 accepted about half the time, rank 1 a third of the rest
            for ranks, tried in (([0, 0], 3), ([1], 3), ([0], 3), ([2, 1], 3), ([], 3), ([0, 0, 0], 0)):
                ctl.observe(len(ranks) + (tried > 0), len(ranks), record=_tree_step(ranks, tried, profile.verify_ms[8]))
        k, n = ctl.next_gamma(), ctl.next_nodes()
        accept, verify = ctl.tree_alphas(), ctl.verify_ms()
        assert verify == pytest.approx(list(profile.verify_ms))     # the records agreed with the profile

        def rate(k, n):
            if k == 0:
                return 1.0 / metrics.iteration_ms(0, ctl.draft_ms, verify, ctl.overhead_ms)
            return metrics.expected_tree_emitted(accept, k, 8)[n] / metrics.iteration_ms(
                k, ctl.draft_ms, verify, ctl.overhead_ms, nodes=n)
        assert k > 0 and rate(k, n) == pytest.approx(max(rate(a, b) for a in range(4) for b in range(1, 9)))
        picks[name] = n
        assert ctl.report()["node_budget_histogram"] == {str(n): 1}
    assert picks["flat"] == 8 and 1 < picks["steep"] < 8


@pytest.mark.parametrize("method", ["vanilla", "suffix"])
def test_cost_controller_with_trees_is_greedy_lossless(greedy_setup, method):
    from drift_cli.engine.tree import TreeConfig

    draft, other, lm, stream, ar, _ = greedy_setup
    profile = profile_costs(lm, CausalLM(draft, "draft"), stream.prompts[0].ids, 4, reps=2, nodes=8)
    cfg = DecodeConfig(gamma=4, max_new_tokens=24, gamma_policy=GammaConfig(policy="cost"), cost_profile=profile,
                       tree=TreeConfig(nodes=8), batch_size=2)
    run = run_stream(lm, METHODS[method](draft, other), stream, cfg)
    assert [g.output_ids for g in run.generations] == ar
    assert all(1 <= s.node_budget <= 8 and s.nodes <= s.node_budget for s in run.steps if s.gamma)
    assert sum(run.report["gamma_controller"]["node_budget_histogram"].values()) == len({s.step for s in run.steps})


def test_predicted_speedup_measured():
    def rec(drafted, accepted, draft, fwd, total):
        return SimpleNamespace(drafted=drafted, accepted=accepted, emitted=accepted + 1, draft_ms=draft,
                               forward_target_ms=fwd, total_ms=total)

    def gen(steps, tokens):
        return SimpleNamespace(steps=steps, output_ids=[0] * tokens)

    ar = [gen([rec(0, 0, 0.0, 10.0, 11.0)] * 4, 4)]
    one = [gen([rec(2, 2, 4.0, 12.0, 17.0), rec(2, 0, 4.0, 12.0, 17.0)], 4)]
    # 4 tokens in 2 iterations; modelled iteration = 2*2 + 1.2*10 + 1 = 17 ms; ar 11 ms a token
    assert metrics.predicted_speedup_measured(one, ar, [1.0, 1.1, 1.2]) == pytest.approx(4 / 34 / (4 / 44))
    assert metrics.predicted_speedup_measured(one, ar, None) is None
    assert metrics.predicted_speedup_measured(one, ar, [1.0, 1.1]) is None      # k = 2 not profiled
    assert metrics.predicted_speedup_measured(one, ar * 2, [1.0, 1.1, 1.2]) is None   # prompts must pair
    # two prompts: the mean of per-prompt ratios, as `speedup` is (not tokens over time pooled)
    two = one + [gen([rec(2, 0, 4.0, 12.0, 17.0)] * 3, 3)]
    ar2 = ar + [gen([rec(0, 0, 0.0, 10.0, 11.0)] * 3, 3)]
    got = metrics.predicted_speedup_measured(two, ar2, [1.0, 1.1, 1.2])
    assert got == pytest.approx(((4 / 34) / (4 / 44) + (3 / 51) / (3 / 33)) / 2)
    assert got != pytest.approx((7 / 85) / (7 / 77))


def test_gamma_histogram():
    steps = [SimpleNamespace(gamma=g) for g in (0, 2, 2, 4, 9)]
    assert metrics.gamma_histogram(steps, 4) == [1, 0, 2, 0, 2]


class Peaked(Vanilla):
    """Certain for the first two positions of every proposal, flat from the third on."""

    def propose(self, context, gamma, sampler):
        self.position = 0
        return super().propose(context, gamma, sampler)

    def adjust(self, hidden, logits, sampler):
        self.position += 1
        if self.position <= 2:
            return torch.zeros_like(logits).index_fill_(-1, torch.tensor([3]), 30.0)
        return torch.zeros_like(logits)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_confidence_stops_inside_the_draft_loop(temperature):
    draft, _ = tiny_pair()
    policy = Peaked(draft)
    prompt = torch.tensor([[1, 2, 3]])
    policy.begin_prompt(prompt)
    policy.p_min = 0.5
    sampler = Sampler(temperature, None, torch.Generator().manual_seed(0))
    prop = policy.propose(prompt, 4, sampler)
    assert prop.k == 2 and prop.tokens[0].tolist() == [3, 3]
    assert prop.top_prob.shape == (1, 2) and float(prop.top_prob.min()) > 0.99
    policy.p_min = None                               # no controller asking: all four drafted
    policy.commit(prompt)
    assert policy.propose(prompt, 4, sampler).k == 4


def test_controller_from_config():
    assert controller(GammaConfig(), 4).next_gamma() == 4
    assert controller(GammaConfig(policy="confidence", p_min=0.3), 4).p_min == 0.3
    assert controller(GammaConfig(policy="cost"), 4, PROFILE).name == "cost"


def _stream(n=3, vocab=48, max_new=24):
    g = torch.Generator().manual_seed(5)
    prompts = [Prompt(tuple(torch.randint(0, vocab, (7,), generator=g).tolist()) * 2, f"d{i}") for i in range(n)]
    return Stream("unit", "test", prompts, max_new)


METHODS = {
    "vanilla": lambda d, o: Vanilla(d),
    "drift": lambda d, o: DriftMethod(d),
    "offline": lambda d, o: Offline(o),
    "osd": lambda d, o: OnlineDistillation(d),
    "pld": lambda d, o: PromptLookup(),
    "suffix": lambda d, o: SuffixDecoding(),
}


@pytest.fixture(scope="module")
def greedy_setup():
    draft, target = tiny_pair(scale=4.0)
    other = tiny_llama(48, 32, 1, seed=9, scale=4.0)
    lm = CausalLM(target, "target")
    stream = _stream()
    base = DecodeConfig(gamma=4, max_new_tokens=24)
    ar = [g.output_ids for g in run_stream(lm, Autoregressive(), stream, base).generations]
    profile = profile_costs(lm, CausalLM(draft, "draft"), stream.prompts[0].ids, 4, reps=2)
    return draft, other, lm, stream, ar, profile


@pytest.mark.parametrize("policy", ["fixed", "hf", "ema", "confidence", "cost"])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_controller_is_greedy_lossless(greedy_setup, method, policy):
    draft, other, lm, stream, ar, profile = greedy_setup
    cfg = DecodeConfig(gamma=4, max_new_tokens=24, gamma_policy=GammaConfig(policy=policy, p_min=0.3),
                       cost_profile=profile)
    run = run_stream(lm, METHODS[method](draft, other), stream, cfg)
    assert [g.output_ids for g in run.generations] == ar
    assert all(0 <= s.gamma <= 4 and s.drafted <= s.gamma for s in run.steps)
    if policy == "fixed":
        assert {s.gamma for s in run.steps} == {4}


def test_profile_costs_measures_every_width_and_resets_the_caches():
    draft, target = tiny_pair()
    lm_t, lm_d = CausalLM(target, "target"), CausalLM(draft, "draft")
    profile = profile_costs(lm_t, lm_d, [1, 2, 3, 4, 5], 3, reps=1)
    assert len(profile.verify_ms) == 4 and all(v > 0 for v in profile.verify_ms) and profile.draft_ms_per_token > 0
    assert profile.verify_ratio()[0] == 1.0
    assert lm_t.cache_len == 0 and lm_d.cache_len == 0
    assert profile_costs(lm_t, None, [1, 2], 2, reps=1).draft_ms_per_token == 0.0


def test_profile_costs_reaches_the_tree_node_budget():
    """With --tree-nodes N the target is profiled up to N + 1 positions (a tree and its root)."""
    draft, target = tiny_pair()
    profile = profile_costs(CausalLM(target, "target"), None, [1, 2, 3], 2, reps=1, nodes=8)
    assert len(profile.verify_ms) == 9 and all(v > 0 for v in profile.verify_ms)
    assert profile.node_ms(8) == profile.verify_ms[8] and profile.node_ms(9) is None
