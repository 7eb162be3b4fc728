"""Test helpers for the model-free drafters: a mixin that counts what a drafter proposed, a
greedy run against `ar`, and the engine's sampling test run on the tiny pair with such a drafter."""

from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, StreamRun, run_stream
from drift_cli.methods.ar import Autoregressive
from drift_cli.stream import Prompt, Stream
from tests.exactness import sampling_p_value
from tests.models import tiny_pair

VOCAB = 8
SAMPLING_PROMPT = [1, 5, 2, 1, 5, 2, 1, 5]   # "2 1 5" recurs: the first iteration always drafts


class CountingProposals:
    """Counts iterations, iterations that drafted, and drafted tokens; checks point-mass proposals."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = self.drafting = self.proposed = 0

    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        self.calls += 1
        self.drafting += prop.k > 0
        self.proposed += prop.k
        assert prop.k <= gamma and prop.q is None
        return prop


def drafter_sampling_run(make_policy, samples: int, **kw):
    """The chi-square sampling test of `tests.exactness` on the tiny pair (vocabulary VOCAB,
    SAMPLING_PROMPT) -> (p value, the first policy built, to inspect what it drafted)."""
    _, target = tiny_pair(vocab=VOCAB, seed=11)
    made = []

    def make():
        made.append(make_policy())
        return made[-1]

    return sampling_p_value(target, make, SAMPLING_PROMPT, samples=samples, **kw), made[0]


def unit_stream(prompts: list[list[int]], max_new: int, tenants: list[str | None] | None = None) -> Stream:
    """A stream of token-id prompts (optionally with tenant ids)."""
    tenants = tenants or [None] * len(prompts)
    return Stream("unit", "test", [Prompt(tuple(p), f"d{i}", tenant=t)
                                   for i, (p, t) in enumerate(zip(prompts, tenants, strict=True))], max_new)


def greedy_against_ar(policy, prompts: list[list[int]], gamma: int, scale: float, max_new: int = 30,
                      eos_id: int | None = None, tenants: list[str | None] | None = None,
                      ) -> tuple[StreamRun, StreamRun]:
    """The tiny pair's target decoding `prompts` greedily with `ar` and with `policy` -> (ar, policy) runs."""
    _, target = tiny_pair(scale=scale)
    lm, stream = CausalLM(target, "target"), unit_stream(prompts, max_new, tenants)
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new, eos_id=eos_id)
    return run_stream(lm, Autoregressive(), stream, cfg), run_stream(lm, policy, stream, cfg)
