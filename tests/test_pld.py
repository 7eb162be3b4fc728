"""`pld`: the n-gram index against a brute-force scan, greedy equality with `ar`, sampling
exactness with a point-mass proposal, options."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.scale import scaled

from drift_cli.commands.options import method_cli_options
from drift_cli.errors import BadInput
from drift_cli.methods.base import MethodContext
from drift_cli.methods.pld import NgramIndex, PldConfig, PromptLookup
from tests.exactness import SIGNIFICANCE, sampling_p_value
from tests.models import tiny_pair
from tests.recording import SAMPLING_PROMPT, VOCAB, CountingProposals, drafter_sampling_run, greedy_against_ar


def brute_lookup(ids: list[int], max_ngram: int, max_tokens: int) -> list[int]:
    """Scan: the most recent earlier occurrence (followed by a token) of the longest suffix n-gram."""
    for n in range(min(max_ngram, len(ids)), 0, -1):
        for e in range(len(ids) - 2, n - 2, -1):
            if ids[e - n + 1:e + 1] == ids[len(ids) - n:]:
                return ids[e + 1:e + 1 + max_tokens]
    return []


@settings(max_examples=scaled(200), deadline=None)
@given(ids=st.lists(st.integers(0, 4), max_size=40), max_ngram=st.integers(1, 5), max_tokens=st.integers(1, 7))
def test_index_lookup_equals_brute_force_at_every_length(ids, max_ngram, max_tokens):
    index = NgramIndex(max_ngram)
    assert index.lookup(max_tokens) == []
    for k, t in enumerate(ids):
        index.append(t)
        assert index.lookup(max_tokens) == brute_lookup(ids[:k + 1], max_ngram, max_tokens)


def test_lookup_prefers_the_longest_ngram_then_the_most_recent_occurrence():
    index = NgramIndex(3)
    for t in [7, 1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]:
        index.append(t)
    # "1 2 3" occurred once, at the start, followed by 4 9 2 ...; "2 3" more recently (-> 5)
    assert index.lookup(3) == [4, 9, 2]
    short = NgramIndex(2)
    for t in [7, 1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]:
        short.append(t)
    assert short.lookup(3) == [5, 6, 1]


class Recording(CountingProposals, PromptLookup):
    """Counts iterations and non-empty proposals."""


REPETITIVE = [[3, 9, 4, 3, 9, 4, 3, 9], [1], [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 2, 11, 5, 6, 7], list(range(20, 37))]


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("max_ngram", [1, 3])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_greedy_output_equals_ar(gamma, max_ngram, scale):
    policy = Recording(PldConfig(max_ngram=max_ngram))
    ar, pld = greedy_against_ar(policy, REPETITIVE, gamma, scale)
    assert [g.output_ids for g in pld.generations] == [g.output_ids for g in ar.generations]
    drafted = sum(s.drafted for s in pld.steps)
    assert drafted > 0 and sum(s.accepted for s in pld.steps) > 0
    assert drafted == policy.proposed            # every proposed token is counted as drafted
    assert all(s.drafted <= gamma for s in pld.steps)
    assert len(pld.steps) < len(ar.steps)       # accepted drafts saved target steps


def test_no_match_drafts_nothing():
    index = NgramIndex(3)
    for t in range(10):
        index.append(t)
    assert index.lookup(4) == []
    policy = PromptLookup()
    policy.begin_prompt(torch.tensor([list(range(10))]))
    prop = policy.propose(torch.tensor([list(range(10))]), 4, sampler=None)
    assert prop.k == 0 and prop.tokens.shape == (1, 0)


@pytest.mark.stats
@pytest.mark.parametrize("kw,samples", [
    ({}, 1200),
    pytest.param({"temperature": 0.7, "top_p": 0.9}, 3000),
], ids=["T1", "T0.7-top_p0.9"])
def test_sampling_matches_target(kw, samples):
    p, policy = drafter_sampling_run(Recording, samples, **kw)
    assert p > SIGNIFICANCE, f"pld changes the output distribution (p = {p:.2e})"
    assert policy.drafting / policy.calls > 0.5, (policy.drafting, policy.calls)


def test_options_and_validation():
    ctx = MethodContext(draft=None, draft_path=None, draft_fingerprint=None, eos_id=None, vocab_size=8,
                        configs={PldConfig: PldConfig.from_options({"pld_max_ngram": 5})})
    assert PromptLookup.build(ctx).cfg.max_ngram == 5
    ctx.configs = {PldConfig: PldConfig.from_options({"pld_max_ngram": None})}
    assert PromptLookup.build(ctx).cfg.max_ngram == 3
    with pytest.raises(BadInput, match="--pld-max-ngram must be >= 1, got 0"):
        PromptLookup(PldConfig(max_ngram=0))
    assert not PromptLookup.uses_draft_model
    assert [o.name for o in method_cli_options("pld")] == ["pld_max_ngram"]


class WrongQ(PromptLookup):
    """Copies tokens as a point mass but tells the engine they came from a uniform q."""

    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        prop.q = torch.full((1, prop.k, VOCAB), 1.0 / VOCAB)
        return prop


@pytest.mark.stats
def test_wrong_proposal_distribution_is_detected():
    """The sampling test has the power to see a point mass passed off as another q."""
    _, target = tiny_pair(vocab=VOCAB, seed=11)
    p = sampling_p_value(target, WrongQ, SAMPLING_PROMPT, samples=1000)
    assert p < SIGNIFICANCE, f"a wrong q for a copied token went unnoticed (p = {p:.3f})"


def test_greedy_with_eos_equals_ar():
    plain, _ = greedy_against_ar(Recording(), REPETITIVE, 4, 8.0)
    eos = plain.generations[0].output_ids[12]
    policy = Recording()
    ar, run = greedy_against_ar(policy, REPETITIVE, 4, 8.0, eos_id=eos)
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]
    assert any(g.hit_eos for g in ar.generations) and policy.proposed > 0
