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


# -- ragged batches (tokens [B, k] plus num_draft [B]), the cases of vLLM's rejection-sampler tests


def _batch_logits(rows: list[list[int]], width: int, vocab: int = 10) -> torch.Tensor:
    """[B, width, V] logits whose argmax per row is `rows[b]` (padded with token 0's argmax)."""
    z = torch.zeros(len(rows), width, vocab)
    for b, best in enumerate(rows):
        for i in range(width):
            z[b, i, best[i] if i < len(best) else 0] = 5.0
    return z


def test_greedy_ragged_rows_with_different_k():
    # row 0 drafted 3 (all accepted -> bonus 7), row 1 drafted 1 (rejected -> correction 4),
    # row 2 drafted 0 (the target's token 6), row 3 drafted 2 (first accepted, second rejected)
    tokens = torch.tensor([[1, 2, 3], [9, 0, 0], [0, 0, 0], [5, 8, 0]])
    logits = _batch_logits([[1, 2, 3, 7], [4, 1], [6], [5, 2, 3]], width=4)
    acc, nxt = accept_greedy(tokens, logits, torch.tensor([3, 1, 0, 2]))
    assert acc.tolist() == [3, 0, 0, 1] and nxt.tolist() == [7, 4, 6, 2]


def test_greedy_padding_that_matches_is_never_accepted():
    # row 0's padding equals the target's argmax: still only its one drafted token counts, and
    # the bonus is the target's token after it
    tokens = torch.tensor([[1, 2, 3], [1, 2, 3]])
    logits = _batch_logits([[1, 2, 3, 4], [1, 2, 3, 4]], width=4)
    acc, nxt = accept_greedy(tokens, logits, torch.tensor([1, 3]))
    assert acc.tolist() == [1, 3] and nxt.tolist() == [2, 4]


def test_greedy_ragged_equals_each_row_alone():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 4, (6, 4), generator=g)
    logits = torch.randn(6, 5, 4, generator=g)
    k = torch.tensor([4, 0, 2, 1, 3, 4])
    acc, nxt = accept_greedy(tokens, logits, k)
    for b in range(6):
        a1, n1 = accept_greedy(tokens[b:b + 1, :k[b]], logits[b:b + 1, :k[b] + 1])
        assert (acc[b], nxt[b]) == (a1[0], n1[0])


def test_greedy_num_draft_none_is_every_row_full():
    tokens = torch.tensor([[1, 2], [1, 5]])
    logits = _batch_logits([[1, 2, 3], [1, 2, 3]], width=3)
    assert [t.tolist() for t in accept_greedy(tokens, logits)] == \
        [t.tolist() for t in accept_greedy(tokens, logits, torch.tensor([2, 2]))]


def test_sampling_ragged_rows_keep_their_own_rule():
    """Row 0 drafted 1 of width 2 (p/q = 3/7, residual [0.75, 0, 0.25], bonus p_2); row 1 drafted
    nothing (its token comes from p_1); row 2 drafted 2, both certain (bonus p_3)."""
    p1, p2, p3 = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.1, 0.8]
    p = torch.tensor([[p1, p2, p3], [p2, p3, p1], [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], p3]])
    q = torch.tensor([[[0.2, 0.7, 0.1], [1 / 3] * 3], [[1 / 3] * 3] * 2, [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    tokens = torch.tensor([[1, 1], [0, 0], [1, 2]])
    k = torch.tensor([1, 0, 2])
    acc, nxt = accept_sampling(_rows3(tokens), _rows3(q), _rows3(p), torch.Generator().manual_seed(4), _rows3(k))
    acc, nxt = acc.view(N // 3, 3), nxt.view(N // 3, 3)
    a0, n0 = acc[:, 0], nxt[:, 0]
    assert abs(a0.float().mean().item() - 3 / 7) < 0.008 and int(a0.max()) == 1
    freq = torch.bincount(n0[a0 == 0], minlength=3).float() / int((a0 == 0).sum())
    torch.testing.assert_close(freq, torch.tensor([0.75, 0.0, 0.25]), atol=0.01, rtol=0)
    bonus = torch.bincount(n0[a0 == 1], minlength=3).float() / int(a0.sum())
    torch.testing.assert_close(bonus, torch.tensor(p2), atol=0.01, rtol=0)
    assert int(acc[:, 1].max()) == 0
    torch.testing.assert_close(torch.bincount(nxt[:, 1], minlength=3).float() / (N // 3), torch.tensor(p2),
                               atol=0.01, rtol=0)
    assert bool((acc[:, 2] == 2).all())
    torch.testing.assert_close(torch.bincount(nxt[:, 2], minlength=3).float() / (N // 3), torch.tensor(p3),
                               atol=0.01, rtol=0)


def test_sampling_ragged_point_mass_row_with_k0_takes_the_target():
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]])
    acc, nxt = accept_sampling(_rows(torch.tensor([[1]])), None, _rows(p), torch.Generator().manual_seed(5),
                               torch.zeros(N, dtype=torch.long))
    assert int(acc.max()) == 0
    torch.testing.assert_close(torch.bincount(nxt, minlength=3).float() / N, torch.tensor([0.5, 0.3, 0.2]),
                               atol=0.006, rtol=0)


def _rows3(x):
    """N // 3 copies of a 3-row batch, interleaved (row b of copy i at 3i + b)."""
    return x.repeat(N // 3, *([1] * (x.dim() - 1)))
