"""The acceptance rule on hand-built distributions."""

from __future__ import annotations

import torch

from drift_cli.engine.acceptance import accept_greedy, accept_sampling


def _logits_with_argmax(best: list[int], vocab: int = 10) -> torch.Tensor:
    z = torch.zeros(1, len(best), vocab)
    for i, b in enumerate(best):
        z[0, i, b] = 5.0
    return z


def test_greedy_accepts_matching_prefix_then_corrects():
    acc, nxt = accept_greedy(torch.tensor([[1, 2, 3]]), _logits_with_argmax([1, 2, 5, 7]))
    assert acc.tolist() == [2] and nxt.tolist() == [5]


def test_greedy_all_accepted_takes_bonus():
    acc, nxt = accept_greedy(torch.tensor([[1, 2, 3]]), _logits_with_argmax([1, 2, 3, 7]))
    assert acc.tolist() == [3] and nxt.tolist() == [7]


def test_greedy_first_mismatch_and_no_draft():
    acc, nxt = accept_greedy(torch.tensor([[4, 2]]), _logits_with_argmax([1, 2, 3]))
    assert acc.tolist() == [0] and nxt.tolist() == [1]
    acc, nxt = accept_greedy(torch.zeros(1, 0, dtype=torch.long), _logits_with_argmax([6]))
    assert acc.tolist() == [0] and nxt.tolist() == [6]


def test_greedy_later_match_after_mismatch_does_not_count():
    acc, _ = accept_greedy(torch.tensor([[9, 2, 3]]), _logits_with_argmax([1, 2, 3, 4]))
    assert acc.tolist() == [0]


N = 200_000  # rows sampled at once; binomial sd of a frequency 0.5 is ~0.0011


def _rows(x):
    return x.expand(N, *x.shape[1:]).contiguous()


def test_sampling_equal_distributions_always_accept():
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]])
    tokens = torch.tensor([[2]])
    acc, _ = accept_sampling(_rows(tokens), _rows(p[:, :1]), _rows(p), torch.Generator().manual_seed(0))
    assert acc.float().mean() == 1.0


def test_sampling_acceptance_probability_and_residual():
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]])
    q = torch.tensor([[[0.2, 0.7, 0.1]]])
    tokens = torch.tensor([[1]])  # p/q = 0.3/0.7
    acc, nxt = accept_sampling(_rows(tokens), _rows(q), _rows(p), torch.Generator().manual_seed(1))
    assert abs(acc.float().mean().item() - 3 / 7) < 0.005
    rejected = nxt[acc == 0]
    # residual norm(max(p - q, 0)) = norm([0.3, 0, 0.1]) = [0.75, 0, 0.25]
    freq = torch.bincount(rejected, minlength=3).float() / len(rejected)
    torch.testing.assert_close(freq, torch.tensor([0.75, 0.0, 0.25]), atol=0.006, rtol=0)
    # accepted rows draw the bonus from p_2
    bonus = torch.bincount(nxt[acc == 1], minlength=3).float() / int(acc.sum())
    torch.testing.assert_close(bonus, torch.tensor([0.2, 0.2, 0.6]), atol=0.006, rtol=0)


def test_point_mass_proposal_accepts_with_target_probability():
    p = torch.tensor([[[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]]])
    tokens = torch.tensor([[1]])
    acc, nxt = accept_sampling(_rows(tokens), None, _rows(p), torch.Generator().manual_seed(2))
    assert abs(acc.float().mean().item() - 0.3) < 0.005
    # residual: p with token 1 removed, renormalised -> [5/7, 0, 2/7]
    freq = torch.bincount(nxt[acc == 0], minlength=3).float() / int((acc == 0).sum())
    torch.testing.assert_close(freq, torch.tensor([5 / 7, 0.0, 2 / 7]), atol=0.006, rtol=0)


def test_zero_target_probability_is_never_accepted():
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]])
    q = torch.tensor([[[0.9, 0.05, 0.05], [0.2, 0.3, 0.5]]])
    tokens = torch.tensor([[0, 2]])
    acc, nxt = accept_sampling(_rows(tokens), _rows(q), _rows(p), torch.Generator().manual_seed(3))
    assert acc.max() == 0 and (nxt != 0).all()


def test_sampling_accepted_length_is_a_prefix():
    # position 1 is always rejected (p = 0), so nothing after it may count even if it "matches"
    p = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]])
    q = torch.tensor([[[0.5, 0.5], [0.0, 1.0], [0.5, 0.5]]])
    tokens = torch.tensor([[0, 1, 0]])
    acc, _ = accept_sampling(_rows(tokens), _rows(q), _rows(p), torch.Generator().manual_seed(4))
    assert set(acc.unique().tolist()) == {1}
