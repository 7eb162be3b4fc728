"""The engine: greedy losslessness, KV rollback, EOS and budget handling."""

from __future__ import annotations

import time

import pytest
import torch

from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, generate, run_stream
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.vanilla import Vanilla
from drift_cli.stream import Prompt, Stream
from tests.models import tiny_llama, tiny_pair


def _stream(prompt_lengths, vocab=48, max_new=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [Prompt(tuple(torch.randint(0, vocab, (n,), generator=g).tolist()), f"d{i}") for i, n in enumerate(prompt_lengths)]
    return Stream("unit", "test", prompts, max_new)


@pytest.mark.parametrize("gamma", [1, 3, 4, 7])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_vanilla_greedy_equals_ar(gamma, scale):
    draft, target = tiny_pair(scale=scale)
    stream = _stream([1, 2, 5, 17])
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=24)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, cfg)
    va = run_stream(lm, Vanilla(draft), stream, cfg)
    assert [g.output_ids for g in va.generations] == [g.output_ids for g in ar.generations]
    assert all(len(g.output_ids) == 24 for g in ar.generations)
    assert sum(s.drafted for s in va.steps) > 0


@pytest.mark.parametrize("eos", [0, 5, 11])
def test_eos_placement_and_budget(eos):
    draft, target = tiny_pair(scale=4.0)
    stream = _stream([3, 9], max_new=40, seed=eos)
    cfg = DecodeConfig(gamma=4, max_new_tokens=40, eos_id=eos)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, cfg)
    va = run_stream(lm, Vanilla(draft), stream, cfg)
    for a, v in zip(ar.generations, va.generations, strict=True):
        assert v.output_ids == a.output_ids
        assert len(a.output_ids) <= 40
        if eos in a.output_ids:
            assert a.output_ids.index(eos) == len(a.output_ids) - 1 and a.hit_eos


def test_vanilla_stops_exactly_at_eos_the_draft_proposes():
    # The draft is the target itself: everything is accepted, so the EOS arrives inside a drafted block.
    _, target = tiny_pair(scale=8.0)
    stream = _stream([4], max_new=30, seed=3)
    plain = run_stream(CausalLM(target, "target"), Autoregressive(), stream, DecodeConfig(max_new_tokens=30))
    eos = plain.generations[0].output_ids[9]
    cfg = DecodeConfig(gamma=4, max_new_tokens=30, eos_id=eos)
    ar = run_stream(CausalLM(target, "target"), Autoregressive(), stream, cfg)
    va = run_stream(CausalLM(target, "target"), Vanilla(target), stream, cfg)
    assert va.generations[0].output_ids == ar.generations[0].output_ids
    assert ar.generations[0].output_ids[-1] == eos
    assert len(ar.generations[0].output_ids) <= 10


def test_self_draft_accepts_everything():
    _, target = tiny_pair()
    stream = _stream([6], max_new=21)
    run = run_stream(CausalLM(target, "target"), Vanilla(target), stream, DecodeConfig(gamma=4, max_new_tokens=21))
    steps = run.steps
    assert sum(s.accepted for s in steps) == sum(s.drafted for s in steps)
    # 21 tokens = 4 blocks of (4 accepted + bonus) + a final step with no room to draft.
    assert [s.emitted for s in steps] == [5, 5, 5, 5, 1]


def _cache_tensors(lm: CausalLM):
    return [(layer.keys.clone(), layer.values.clone()) for layer in lm.cache.layers]


@pytest.mark.parametrize("keep", [3, 7, 10])
def test_kv_cache_after_rollback_equals_fresh_prefill(keep):
    model = tiny_llama(seed=3)
    ids = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(1))
    rolled = CausalLM(model)
    rolled.forward(ids[:, :5])
    rolled.forward(ids[:, 5:])        # cache holds 12 positions
    rolled.crop(keep)                 # roll back
    fresh = CausalLM(model)
    fresh.forward(ids[:, :keep])
    assert rolled.cache_len == fresh.cache_len == keep
    for (k1, v1), (k2, v2) in zip(_cache_tensors(rolled), _cache_tensors(fresh), strict=True):
        assert k1.shape == k2.shape
        torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-6)
    # and the next step's logits agree too
    _, a = rolled.forward(ids[:, keep:keep + 2])
    _, b = fresh.forward(ids[:, keep:keep + 2])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class Sleepy(Vanilla):
    """Vanilla that spends known times in the drafting, outside every phase, and in the adaptation."""

    name = "sleepy"

    def propose(self, context, gamma, sampler):
        time.sleep(0.002)
        return super().propose(context, gamma, sampler)

    def commit(self, context):           # between verify and adapt: no phase of its own
        time.sleep(0.003)
        super().commit(context)

    def observe(self, feedback):
        time.sleep(0.004)


def test_step_records_time_split_adds_up():
    draft, target = tiny_pair()
    run = run_stream(CausalLM(target, "target"), Sleepy(draft), _stream([4]), DecodeConfig(gamma=3, max_new_tokens=12))
    for s in run.steps:
        drafting = s.drafted > 0        # the budget's last iteration drafts nothing (propose is not called)
        assert s.draft_ms >= (2.0 if drafting else 0.0) and s.adapt_ms >= 4.0 and s.other_ms >= 3.0
        assert s.other_ms == pytest.approx(s.total_ms - s.draft_ms - s.verify_ms - s.adapt_ms, abs=1e-9)
        assert s.draft_ms >= s.forward_draft_ms >= 0 and s.verify_ms >= s.forward_target_ms > 0
        assert len(s.target_entropy) == s.drafted
        assert 0 <= s.accepted <= s.drafted <= 3


class InterruptAfter(Vanilla):
    """Simulates Ctrl-C during the second prompt."""

    name = "interrupt"
    prompts = 0

    def begin_prompt(self, prompt, tenant=None):
        self.prompts += 1
        if self.prompts == 2:
            raise KeyboardInterrupt
        super().begin_prompt(prompt, tenant)


def test_interrupted_stream_keeps_what_finished():
    draft, target = tiny_pair()
    run = run_stream(CausalLM(target, "target"), InterruptAfter(draft), _stream([3, 4, 5]), DecodeConfig(max_new_tokens=6))
    assert run.complete is False
    assert len(run.generations) == 1 and len(run.generations[0].output_ids) == 6


class Keeping(Vanilla):
    """Keeps every feedback it observes."""

    name = "keeping"

    def begin_stream(self):
        self.seen = []

    def observe(self, feedback):
        self.seen.append(feedback)


@torch.inference_mode()
def test_feedback_carries_the_target_pass_at_every_drafted_position():
    draft, target = tiny_pair()
    policy = Keeping(draft)
    run_stream(CausalLM(target, "target"), policy, _stream([5]), DecodeConfig(gamma=3, max_new_tokens=12))
    fb = policy.seen[0]
    k = fb.proposal.k
    assert fb.target_logits.shape[1] == fb.target_hidden.shape[1] == k + 1
    assert fb.target_hidden.shape[-1] == target.config.hidden_size
    # the logits are the target's head applied to the hidden states it exposes
    torch.testing.assert_close(target.lm_head(fb.target_hidden).float(), fb.target_logits)
    # and they are the target's distributions for [last, x1..xk] of this context
    ids = torch.cat([fb.context[0], fb.proposal.tokens[0]])[None]
    full = target(ids).logits[:, -(k + 1):].float()
    torch.testing.assert_close(full, fb.target_logits, rtol=1e-4, atol=1e-4)
