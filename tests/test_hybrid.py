"""`hybrid`: greedy equality with `ar` for every model source at B in {1, 2, 8}, sampling
exactness at batch 4 with a biased DRIFT (and the wrong rule still caught), the model draft's
catch-up without a re-prefill, the per-source metrics, the rules and the options."""

from __future__ import annotations

import pytest
import torch

from drift_cli import metrics
from drift_cli.engine.gamma import GammaConfig
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods import METHODS, settings_classes
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import MethodContext
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.hybrid import Hybrid, HybridConfig, expected_accepted
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixConfig, SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.config import OSDConfig
from tests.exactness import SIGNIFICANCE, sampling_p_value
from tests.models import tiny_llama, tiny_pair
from tests.recording import SAMPLING_PROMPT, VOCAB, unit_stream
from tests.test_batch import DRIFT_CFG, EOS, GAMMA, MAX_NEW, PROMPTS, SCALE

MODEL_SOURCES = {
    "drift": lambda d, o: DriftMethod(d, DRIFT_CFG),
    "vanilla": lambda d, o: Vanilla(d),
    "offline": lambda d, o: Offline(o),
    "osd": lambda d, o: OnlineDistillation(d, OSDConfig(interval=2.0, steps=1, batch=4)),
}


@pytest.fixture(scope="module")
def models():
    draft, target = tiny_pair(scale=SCALE)
    return draft, tiny_llama(48, 32, 1, 5, SCALE), target


def _run(models, policy, batch: int, eos: int | None = EOS, gamma: int = GAMMA, prompts=PROMPTS, **kw):
    _, _, target = models
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=MAX_NEW, eos_id=eos, batch_size=batch, **kw)
    return run_stream(CausalLM(target, "target"), policy, unit_stream(prompts, MAX_NEW), cfg)


@pytest.fixture(scope="module")
def reference(models):
    return [g.output_ids for g in _run(models, Autoregressive(), 1).generations]


def _switches(run, copy: str, model: str) -> bool:
    """Some row's consecutive steps came from different sources, both drafting."""
    return any({a.source, b.source} == {copy, model} for g in run.generations for a, b in zip(g.steps, g.steps[1:]))


def _eos_in_copied_block(run, copy: str) -> bool:
    """Some row ended on a copied block holding an accepted EOS (emitted <= accepted: the token after it was cut)."""
    return any(g.hit_eos and g.steps[-1].source == copy and g.steps[-1].emitted <= g.steps[-1].accepted
               for g in run.generations)


SOURCES = [(SuffixDecoding, m) for m in MODEL_SOURCES] + [(PromptLookup, "drift")]


@pytest.mark.parametrize("batch", [1, 2, 8])
@pytest.mark.parametrize("copy,model", SOURCES, ids=[f"{c.name}-{m}" for c, m in SOURCES])
def test_greedy_equals_ar_for_every_model_source(models, reference, copy, model, batch):
    draft, other, _ = models
    policy = Hybrid(copy(), MODEL_SOURCES[model](draft, other))
    run = _run(models, policy, batch)
    assert [g.output_ids for g in run.generations] == reference
    sources = {s.source for s in run.steps}
    assert {copy.name, model} <= sources
    assert _switches(run, copy.name, model)
    assert max(s.batch for s in run.steps) == batch


@pytest.mark.parametrize("rule", ["score", "length", "learned"])
@pytest.mark.parametrize("learn_copied", [False, True])
def test_greedy_equals_ar_for_every_rule(models, reference, rule, learn_copied):
    draft, _, _ = models
    policy = Hybrid(SuffixDecoding(), DriftMethod(draft, DRIFT_CFG), HybridConfig(rule=rule, learn_copied=learn_copied))
    run = _run(models, policy, 2)
    assert [g.output_ids for g in run.generations] == reference
    assert {"suffix", "drift"} <= {s.source for s in run.steps}
    assert (run.report["learned_from_copied_steps"] > 0) == learn_copied


@pytest.fixture(scope="module")
def drift_b2(models):
    """hybrid (suffix + drift) at batch 2 on the stream with EOS."""
    draft, _, _ = models
    return _run(models, Hybrid(SuffixDecoding(), DriftMethod(draft, DRIFT_CFG)), 2)


def test_eos_inside_a_copied_block(reference, drift_b2):
    assert [g.output_ids for g in drift_b2.generations] == reference
    assert _eos_in_copied_block(drift_b2, "suffix")


@pytest.mark.parametrize("gamma_policy", [GammaConfig(policy="hf"), GammaConfig(policy="ema"),
                                          GammaConfig(policy="confidence", p_min=0.3)], ids=["hf", "ema", "confidence"])
def test_greedy_equals_ar_under_every_gamma_controller(models, reference, gamma_policy):
    draft, _, _ = models
    run = _run(models, Hybrid(SuffixDecoding(), DriftMethod(draft, DRIFT_CFG)), 2, gamma_policy=gamma_policy)
    assert [g.output_ids for g in run.generations] == reference
    assert {"suffix", "drift"} <= {s.source for s in run.steps}


def test_target_change_stream_equals_each_targets_ar(models):
    draft, other, target = models
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=2)
    stream = unit_stream(PROMPTS, MAX_NEW)
    switch = (4, CausalLM(other, "target"))
    ar = run_stream(CausalLM(target, "target"), Autoregressive(), stream, cfg, switch=switch)
    run = run_stream(CausalLM(target, "target"), Hybrid(SuffixDecoding(), DriftMethod(draft, DRIFT_CFG)), stream, cfg,
                     switch=switch)
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]


# -- the model draft's cache catches up without a re-prefill --------------------------------------


def _count_fed(policy) -> list[int]:
    """Counts the tokens the model source's draft LM is fed (every forward goes through forward_rows)."""
    lm, fed = policy.model.lm, [0]
    forward_rows = lm.forward_rows

    def counting(slots, feeds):
        fed[0] += sum(feeds.shape[1] for _ in slots) if isinstance(feeds, torch.Tensor) else sum(len(f) for f in feeds)
        return forward_rows(slots, feeds)
    lm.forward_rows = counting
    return fed


def _expected_fed(run, model: str) -> int:
    """Every committed token fed once (the prefill, a catch-up or an accepted draft), plus the drafts
    the model fed and rolled back: per prompt, the committed length at its last model step plus
    every model step's fed drafts (all but the last drafted token) less those that were kept."""
    total = 0
    for g in run.generations:
        length = len(g.prompt_ids)
        last, kept = length - 1, 0          # a prompt with no model step: just its prefill
        for s in g.steps:
            if s.source == model:
                fed_drafts = s.drafted - 1
                total += fed_drafts
                last = length
                kept_now = min(fed_drafts, s.accepted)
                kept += kept_now
                last_kept = kept_now
            length += s.emitted
        if last != len(g.prompt_ids) - 1:
            kept -= last_kept                  # the last model step's kept drafts come after `last`
        total += last - kept
    return total


@pytest.mark.parametrize("model", ["vanilla", "drift"])
def test_catch_up_feeds_each_committed_token_once(models, model):
    """No EOS, a fixed γ, batch 1: the model draft's forward tokens are the committed tokens plus
    the drafted ones it fed (nothing fed twice), with copied blocks caught up in the next draft
    forward; and the vanilla method (every step the model's) obeys the same count."""
    draft, other, _ = models
    policy = Hybrid(SuffixDecoding(), MODEL_SOURCES[model](draft, other))
    fed = _count_fed(policy)
    run = _run(models, policy, 1, eos=None, prompts=PROMPTS[:6])
    assert {"suffix", model} <= {s.source for s in run.steps}
    assert fed[0] == _expected_fed(run, model)
    # catch-up happened: a model step right after a copied block of the same prompt
    assert any(a.source == "suffix" and b.source == model for g in run.generations for a, b in zip(g.steps, g.steps[1:]))
    alone = Vanilla(draft)
    fed_alone = [0]
    forward_rows = alone.lm.forward_rows
    alone.lm.forward_rows = lambda s, f: (fed_alone.__setitem__(0, fed_alone[0] + sum(len(x) for x in f)),
                                          forward_rows(s, f))[1]
    plain = _run(models, alone, 1, eos=None, prompts=PROMPTS[:6])
    for s in plain.steps:
        s.source = "vanilla"
    assert fed_alone[0] == _expected_fed(plain, "vanilla")


# -- metrics ------------------------------------------------------------------------------------------


def test_per_source_metrics_add_up_to_the_totals(models, drift_b2):
    run = drift_b2
    m = metrics.method_metrics(run, GAMMA)
    sources = m["by_source"]["sources"]
    assert {"suffix", "drift"} <= set(sources)
    assert sum(s["iterations"] for s in sources.values()) == m["iterations"]
    assert sum(s["drafted_tokens"] for s in sources.values()) == m["drafted_tokens"]
    assert sum(s["accepted_tokens"] for s in sources.values()) == m["accepted_tokens"]
    assert sum(s["share"] for s in sources.values()) == pytest.approx(1.0)
    for name, s in sources.items():
        steps = [x for x in run.steps if (x.source or "none") == name]
        assert s["acceptance_rate"] == metrics.acceptance_rate(steps)
        assert s["mean_accepted_length"] == metrics.mean_accepted_length(steps)
    # α is the drafted-weighted mean of the sources' α; τ the iteration-weighted mean of theirs
    drafted = {n: s["drafted_tokens"] for n, s in sources.items() if s["drafted_tokens"]}
    assert sum(sources[n]["acceptance_rate"] * d for n, d in drafted.items()) / sum(drafted.values()) == \
        pytest.approx(m["acceptance_rate"])
    assert sum(s["mean_accepted_length"] * s["iterations"] for s in sources.values()) / m["iterations"] == \
        pytest.approx(m["mean_accepted_length"])
    assert 0 < m["by_source"]["choose_pct"] < 100
    assert metrics.by_source(_run(models, Vanilla(models[0]), 1).steps) is None


# -- the rules ------------------------------------------------------------------------------------


def test_rules_choose_as_documented():
    copy = SuffixDecoding(SuffixConfig(min_token_prob=0.0))
    h = Hybrid(copy, Vanilla(tiny_pair()[0]), HybridConfig(rule="score", min_score=1.5))
    from drift_cli.methods.hybrid import _Pick
    assert not h._copies(_Pick([1, 2], 1.2), 0) and h._copies(_Pick([1, 2], 1.6), 0)
    assert not h._copies(_Pick([], 9.0), 0)
    h.cfg = HybridConfig(rule="length", min_length=3)
    assert not h._copies(_Pick([1, 2], 2.0), 0) and h._copies(_Pick([1, 2, 3], 0.1), 0)
    h.cfg = HybridConfig(rule="learned", min_score=1.0)
    h.rate[0] = 0.5
    assert expected_accepted(0.5, 3) == pytest.approx(0.875)
    assert not h._copies(_Pick([1, 2, 3], 3.0), 0)
    h.rate[0] = 0.9
    assert h._copies(_Pick([1, 2], 0.0), 0)


def test_learned_rule_rate_follows_copying_acceptance(models):
    draft, _, _ = models
    policy = Hybrid(SuffixDecoding(), Vanilla(draft), HybridConfig(rule="learned"))
    _run(models, policy, 1)
    assert set(policy.rate) == {0} and 0.0 <= policy.rate[0] <= 1.0 and policy.rate[0] != 0.5


# -- sampling -------------------------------------------------------------------------------------


class _Counting(Hybrid):
    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        for s in prop.source:
            self.chosen[s] = self.chosen.get(s, 0) + 1
        return prop


def _sampling_hybrid(model, made: list, **cfg):
    h = _Counting(SuffixDecoding(SuffixConfig(min_token_prob=0.0)), model, HybridConfig(min_score=0.5, **cfg))
    h.chosen = {}
    made.append(h)
    return h


@pytest.mark.stats
@pytest.mark.parametrize("learn_copied", [False, True])
def test_sampling_is_exact_at_batch_4_with_a_biased_drift(learn_copied):
    from tests.test_sampling_exactness import _moving_drift

    draft, target = tiny_pair(vocab=VOCAB, seed=11)
    moved, made = [], []
    p = sampling_p_value(target, lambda: _sampling_hybrid(_moving_drift(draft, moved), made, learn_copied=learn_copied),
                         SAMPLING_PROMPT, samples=3000, batch=4)
    chosen = made[0].chosen
    assert chosen.get("suffix", 0) > 0.1 * sum(chosen.values()) and chosen.get("drift", 0) > 0.1 * sum(chosen.values())
    assert sum(moved) > len(moved) // 2          # most model proposals were drawn from a biased q'
    assert p > SIGNIFICANCE, f"hybrid changes the output distribution at batch 4 (p = {p:.2e})"


@pytest.mark.stats
def test_wrong_rule_is_detected_inside_the_hybrid():
    from tests.test_sampling_exactness import WrongRule

    draft, target = tiny_pair(vocab=VOCAB, seed=11)
    made = []
    p = sampling_p_value(target, lambda: _sampling_hybrid(WrongRule(draft), made), SAMPLING_PROMPT, samples=3000, batch=4)
    assert made[0].chosen.get("wrong", 0) > 0
    assert p < SIGNIFICANCE, f"the wrong acceptance rule went unnoticed inside the hybrid (p = {p:.3f})"


# -- options --------------------------------------------------------------------------------------


def test_build_from_options_and_validation():
    draft, _ = tiny_pair()
    opts = {"hybrid_copy": "pld", "hybrid_model": "vanilla", "hybrid_rule": "length", "hybrid_min_length": 3,
            "pld_max_ngram": 2}
    ctx = MethodContext(draft=draft, draft_path=None, draft_fingerprint=None, eos_id=None, vocab_size=48,
                        configs=MethodContext.settings_from_options(opts, settings_classes()))
    h = METHODS["hybrid"].build(ctx)
    assert isinstance(h.copy, PromptLookup) and h.copy.cfg.max_ngram == 2 and isinstance(h.model, Vanilla)
    assert h.cfg == HybridConfig(copy="pld", model="vanilla", rule="length", min_length=3)
    for bad, message in (({"hybrid_copy": "ngram"}, "--hybrid-copy must be one of suffix, pld"),
                         ({"hybrid_rule": "oracle"}, "--hybrid-rule must be one of score, length, learned"),
                         ({"hybrid_min_score": -1.0}, "--hybrid-min-score must be >= 0"),
                         ({"hybrid_min_length": 0}, "--hybrid-min-length must be >= 1")):
        with pytest.raises(BadInput, match=message):
            MethodContext.settings_from_options(bad, [HybridConfig])
