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


@pytest.fixture(params=["small-vocab", "counting"])
def counting(request, monkeypatch):
    """Both searches: at a small vocabulary (no counting pass), and with the counting pass on."""
    if request.param == "counting":
        monkeypatch.setattr(sampling, "NUCLEUS_COUNT_VOCAB", 0)
    return request.param


@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5, 4.0, 12.0])   # flat (nucleus ~ all of V) .. peaked
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("rows", [1, 5])
def test_nucleus_equals_the_full_sort(scale, top_p, rows, counting):
    g = torch.Generator().manual_seed(int(scale * 100) + rows)
    logits = torch.randn(rows, 4099, generator=g) * scale
    got, want = top_p_filter(logits, top_p), full_sort_filter(logits, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(want)])


def searched(monkeypatch, logits, top_p):
    """Check nucleus() against the full sort; return (ranked, each ranking the search did:
    ("topk", k) or ("sort", V))."""
    want = full_sort_filter(logits, top_p)
    calls = []
    topk, sort = torch.topk, torch.sort
    monkeypatch.setattr(torch, "topk", lambda x, k, **kw: calls.append(("topk", k)) or topk(x, k, **kw))
    monkeypatch.setattr(torch, "sort", lambda x, **kw: calls.append(("sort", x.shape[-1])) or sort(x, **kw))
    ranked, order = nucleus(logits, top_p)
    monkeypatch.setattr(torch, "topk", topk)
    monkeypatch.setattr(torch, "sort", sort)
    got = torch.full_like(logits, float("-inf")).scatter(-1, order, ranked)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(want)])
    return ranked, calls


def test_a_flat_row_goes_from_the_first_guess_straight_to_one_full_sort(monkeypatch, counting):
    ranked, calls = searched(monkeypatch, torch.zeros(1, 5000), 0.9)
    assert calls == [("topk", sampling.NUCLEUS_CANDIDATES), ("sort", 5000)]
    assert int(torch.isfinite(ranked).sum()) == 4500            # 90% of a uniform 5000


def test_a_mid_sized_nucleus_is_ranked_by_a_second_top_k(monkeypatch):
    monkeypatch.setattr(sampling, "NUCLEUS_COUNT_VOCAB", 8000)
    logits = torch.randn(5, 8000, generator=torch.Generator().manual_seed(3)) * 2.5
    ranked, calls = searched(monkeypatch, logits, 0.9)
    assert [c[0] for c in calls] == ["topk", "topk"]
    assert sampling.NUCLEUS_CANDIDATES < calls[1][1] <= 8000 * sampling.NUCLEUS_SORT_FRACTION
    assert int(torch.isfinite(ranked).sum(-1).max()) > sampling.NUCLEUS_CANDIDATES


def test_a_second_guess_that_falls_short_falls_back_to_the_full_sort(monkeypatch):
    monkeypatch.setattr(sampling, "NUCLEUS_COUNT_VOCAB", 8000)
    monkeypatch.setattr(sampling, "NUCLEUS_MARGIN", -0.3)      # the guess now undershoots the nucleus
    logits = torch.randn(5, 8000, generator=torch.Generator().manual_seed(3)) * 2.5
    _, calls = searched(monkeypatch, logits, 0.9)
    assert [c[0] for c in calls] == ["topk", "topk", "sort"]


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
@pytest.mark.parametrize("scale", [0.3, 1.0, 2.0, 3.0])
def test_the_search_ranks_at_most_twice_before_one_full_sort(monkeypatch, scale, top_p, counting):
    logits = torch.randn(2, 3, 6000, generator=torch.Generator().manual_seed(7)) * scale
    _, calls = searched(monkeypatch, logits, top_p)
    kinds = [c[0] for c in calls]
    assert kinds[0] == "topk" and kinds.count("sort") <= 1 and len(kinds) <= 3
    assert kinds[-1] == "sort" or len(kinds) <= 2
    if counting == "small-vocab":                               # below NUCLEUS_COUNT_VOCAB: no second top-k
        assert kinds in (["topk"], ["topk", "sort"])


def test_a_mid_sized_nucleus_at_a_small_vocabulary_is_sorted(monkeypatch):
    logits = torch.randn(5, 8000, generator=torch.Generator().manual_seed(3)) * 2.5
    _, calls = searched(monkeypatch, logits, 0.9)
    assert calls == [("topk", sampling.NUCLEUS_CANDIDATES), ("sort", 8000)]


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
