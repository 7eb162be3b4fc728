"""`suffix`: greedy equality with `ar`, sampling exactness, tenants, the token budget, options."""

from __future__ import annotations

import click
import pytest
import torch
from click.testing import CliRunner

from drift_cli.commands.options import method_cli_options
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods.base import MethodContext
from drift_cli.methods.suffix import SuffixConfig, SuffixDecoding
from tests.exactness import SIGNIFICANCE
from tests.models import tiny_pair
from tests.recording import CountingProposals, drafter_sampling_run, greedy_against_ar, unit_stream


class Recording(CountingProposals, SuffixDecoding):
    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        # the policy's mirror of the context is the engine's context
        assert self._context == context[0].tolist()
        return prop


# Later prompts repeat earlier ones, so the stream trie (earlier outputs) gets used too.
PROMPTS = [[3, 9, 4, 3, 9, 4, 3, 9], [1], [5, 6, 7, 8, 5, 6, 2, 11], [3, 9, 4], [1], list(range(20, 33))]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("cfg", [SuffixConfig(), SuffixConfig(max_depth=4, max_spec_factor=2.0, min_token_prob=0.0)],
                         ids=["default", "shallow"])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_greedy_output_equals_ar(gamma, cfg, scale):
    policy = Recording(cfg)
    ar, run = greedy_against_ar(policy, PROMPTS, gamma, scale)
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]
    assert sum(s.drafted for s in run.steps) == policy.proposed > 0
    assert sum(s.accepted for s in run.steps) > 0
    assert len(run.steps) < len(ar.steps)
    assert run.report["suffix_stream_tokens"] == sum(len(g.output_ids) for g in ar.generations)
    assert run.report["suffix_drafts_from_stream"] > 0


def test_stream_trie_is_per_tenant():
    policy = SuffixDecoding(SuffixConfig(max_depth=8))
    policy.begin_stream()
    policy.begin_prompt(torch.tensor([[1, 2]]), "a")
    policy.commit(torch.tensor([[1, 2, 3, 4, 5, 6]]))
    policy.end_prompt(torch.tensor([[3, 4, 5, 6]]))
    for tenant, expected in (("b", []), ("a", [5, 6]), (None, [])):
        policy.begin_prompt(torch.tensor([[9, 3, 4]]), tenant)
        assert policy.propose(torch.tensor([[9, 3, 4]]), 4, sampler=None).tokens[0].tolist() == expected
    assert policy.report()["suffix_stream_tenants"] == 1


def test_draft_length_grows_with_the_match_and_never_exceeds_gamma():
    policy = SuffixDecoding(SuffixConfig(max_depth=16, max_spec_factor=1.0, min_token_prob=0.0))
    policy.begin_prompt(torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14, 15]]), None)
    policy.end_prompt(torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14, 15]]))
    for context, gamma, expected in (
        ([1, 7], 8, [8]),                       # match length 1 -> 1 token
        ([1, 7, 8, 9], 8, [10, 11, 12]),        # match length 3 -> 3 tokens
        ([1, 7, 8, 9], 2, [10, 11]),            # ... capped at gamma
    ):
        policy.begin_prompt(torch.tensor([context]), None)
        assert policy.propose(torch.tensor([context]), gamma, sampler=None).tokens[0].tolist() == expected


def test_token_budget_evicts_the_oldest_outputs():
    _, target = tiny_pair(scale=8.0)
    prompts = [[i, i + 1, i + 2] for i in range(0, 30, 3)]
    stream = unit_stream(prompts, max_new=20)
    policy = SuffixDecoding(SuffixConfig(max_tokens=50))
    run = run_stream(CausalLM(target, "target"), policy, stream, DecodeConfig(gamma=3, max_new_tokens=20))
    rep = run.report
    assert rep["suffix_stream_tokens"] <= 50 and rep["suffix_stream_documents"] == 2
    assert rep["suffix_evictions"] == len(prompts) - 2
    assert rep["suffix_stream_nodes"] <= 50 * SuffixConfig().max_depth


@pytest.mark.stats
@pytest.mark.parametrize("kw,samples", [
    ({}, 1200),
    pytest.param({"temperature": 0.7, "top_p": 0.9}, 3000),
], ids=["T1", "T0.7-top_p0.9"])
def test_sampling_matches_target(kw, samples):
    """One policy serves all samples, so its stream trie learns from earlier samples' outputs."""
    p, policy = drafter_sampling_run(lambda: Recording(SuffixConfig(min_token_prob=0.0)), samples, **kw)
    assert p > SIGNIFICANCE, f"suffix changes the output distribution (p = {p:.2e})"
    assert policy.drafting / policy.calls > 0.5, (policy.drafting, policy.calls)
    assert policy.drafts_from["stream"] > 0


def test_options_and_validation():
    ctx = MethodContext(draft=None, draft_path=None, draft_fingerprint=None, eos_id=None, vocab_size=8,
                        configs={SuffixConfig: SuffixConfig.from_options(
                            {"suffix_max_depth": 7, "suffix_max_spec_factor": None,
                             "suffix_min_token_prob": 0.25, "suffix_max_tokens": 100})})
    cfg = SuffixDecoding.build(ctx).cfg
    assert cfg == SuffixConfig(max_depth=7, max_spec_factor=1.0, min_token_prob=0.25, max_tokens=100)
    for bad, message in (
        ({"max_depth": 0}, "--suffix-max-depth must be >= 1, got 0"),
        ({"max_spec_factor": 0.0}, "--suffix-max-spec-factor must be > 0, got 0.0"),
        ({"min_token_prob": 1.5}, r"--suffix-min-token-prob must be in \[0, 1\], got 1.5"),
        ({"max_tokens": 0}, "--suffix-max-tokens must be >= 1, got 0"),
    ):
        with pytest.raises(BadInput, match=message):
            SuffixDecoding(SuffixConfig(**bad))
    assert sorted(o.name for o in method_cli_options("suffix")) == [
        "suffix_max_depth", "suffix_max_spec_factor", "suffix_max_tokens", "suffix_min_token_prob"]


def test_greedy_with_tenants_and_eos_equals_ar():
    tenants = ["a", "b", "a", "b", None, "a"]
    plain, _ = greedy_against_ar(Recording(), PROMPTS, 4, 8.0, tenants=tenants)
    eos = plain.generations[0].output_ids[12]      # a token the target does emit
    policy = Recording()
    ar, run = greedy_against_ar(policy, PROMPTS, 4, 8.0, eos_id=eos, tenants=tenants)
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]
    assert any(g.hit_eos for g in ar.generations) and policy.proposed > 0
    assert run.report["suffix_stream_tenants"] == 3


def test_cli_options_parse_and_reject_bad_values():
    seen = {}
    cmd = click.Command("bench", params=method_cli_options("suffix"), callback=lambda **kw: seen.update(kw))
    runner = CliRunner()
    ok = runner.invoke(cmd, ["--suffix-max-depth", "8", "--suffix-min-token-prob", "0.3"])
    assert ok.exit_code == 0, ok.output
    assert SuffixConfig.from_options(seen) == SuffixConfig(max_depth=8, min_token_prob=0.3)
    for args in (["--suffix-max-depth", "0"], ["--suffix-max-spec-factor", "0"], ["--suffix-min-token-prob", "2"]):
        bad = runner.invoke(cmd, args)
        assert bad.exit_code == 2 and "Invalid value" in bad.output, (args, bad.output)


def test_state_never_crosses_streams():
    """begin_stream forgets earlier outputs: the same stream run twice drafts identically."""
    _, target = tiny_pair(scale=8.0)
    lm = CausalLM(target, "target")
    stream = unit_stream(PROMPTS, max_new=20)
    policy = SuffixDecoding()
    first = run_stream(lm, policy, stream, DecodeConfig(gamma=4, max_new_tokens=20))
    second = run_stream(lm, policy, stream, DecodeConfig(gamma=4, max_new_tokens=20))
    fresh = run_stream(lm, SuffixDecoding(), stream, DecodeConfig(gamma=4, max_new_tokens=20))
    key = lambda run: [(s.drafted, s.accepted) for s in run.steps]  # noqa: E731
    assert key(first) == key(second) == key(fresh)
    assert first.report == second.report
