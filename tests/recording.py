"""Test helper: a mixin that counts what a model-free drafter proposed."""


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
