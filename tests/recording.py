"""Test helpers for the model-free drafters: a mixin that counts what a drafter proposed, and
the engine's sampling test run on the tiny pair with such a drafter."""

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
