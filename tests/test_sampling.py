"""The top-p nucleus from a partial sort equals the full sort's, including when it must grow."""

from __future__ import annotations

import pytest
import torch

from drift_cli.engine import sampling
from drift_cli.engine.sampling import Sampler, nucleus, top_p_filter


def full_sort_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: rank the whole vocabulary, keep a token while the mass before it < top_p
    (probabilities as exp(logit - logsumexp), the arithmetic the sampler uses: a softmax rounds
    differently in the last bit, which moves a token whose preceding mass is top_p to the ulp)."""
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    p = (ranked - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()
    drop = torch.zeros_like(ranked, dtype=torch.bool).scatter(-1, order, (p.cumsum(-1) - p) >= top_p)
    return logits.masked_fill(drop, float("-inf"))


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0])   # flat (nucleus ~ all of V) .. peaked
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("rows", [1, 5])
def test_nucleus_equals_the_full_sort(scale, top_p, rows):
    g = torch.Generator().manual_seed(int(scale * 100) + rows)
    logits = torch.randn(rows, 4099, generator=g) * scale
    got, want = top_p_filter(logits, top_p), full_sort_filter(logits, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(want)])


def test_the_candidates_grow_when_the_nucleus_is_larger(monkeypatch):
    calls = []
    real = torch.topk
    monkeypatch.setattr(torch, "topk", lambda x, k, **kw: calls.append(k) or real(x, k, **kw))
    flat = torch.zeros(1, 5000)
    ranked, order = nucleus(flat, 0.9)
    assert calls == [sampling.NUCLEUS_CANDIDATES, sampling.NUCLEUS_CANDIDATES * 8, sampling.NUCLEUS_CANDIDATES * 64]
    assert int(torch.isfinite(ranked).sum()) == 4500            # 90% of a uniform 5000
    assert order.shape[-1] == 5000                                # the last round was the full sort


def test_sampler_probs_are_the_masked_softmax_and_picks_stay_inside():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 2000, generator=g) * 3
    s = Sampler(0.7, 0.9, torch.Generator().manual_seed(1))
    z = s.sampling_logits(logits)
    want = torch.softmax(full_sort_filter(z, 0.9), dim=-1)
    assert torch.allclose(s.probs(z), want, atol=1e-6)
    for _ in range(50):
        tokens, probs = s.pick(z)
        assert torch.allclose(probs, want, atol=1e-6)
        assert bool((want.gather(-1, tokens[:, None]) > 0).all())
