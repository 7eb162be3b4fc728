"""Divergences: zero on equal distributions, positive otherwise, hand-computed values, safe at p = 0."""

import math

import pytest
import torch

from drift_cli.divergence import DIVERGENCES, RKL_LOGPROB_FLOOR, divergence
from drift_cli.errors import BadInput


def logs(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


P_HALF = logs([0.5, 0.5, 0.0])          # target with a zero-mass token
Q_QUARTER = logs([0.25, 0.25, 0.5])     # draft logits (log-probs are valid logits)


@pytest.mark.parametrize(
    "kind, p, q, expected",
    [
        # KL(p||q) = 2 * 0.5 ln(0.5 / 0.25) = ln 2; the p = 0 token adds nothing.
        ("fkl", P_HALF, Q_QUARTER, math.log(2)),
        # KL(q||p) = 0.25 ln(0.25/0.5) + 0.5 ln(0.5/0.25) + 0 = 0.25 ln 2
        ("rkl", logs([0.5, 0.25, 0.25]), logs([0.25, 0.5, 0.25]), 0.25 * math.log(2)),
        # m = (3/8, 3/8, 1/4): KL(p||m) = ln(4/3); KL(q||m) = 0.5 ln(2/3) + 0.5 ln 2
        ("jsd", P_HALF, Q_QUARTER, 0.5 * (math.log(4 / 3) + 0.5 * math.log(2 / 3) + 0.5 * math.log(2))),
        # (0.25 + 0.25 + 0.5) / 2
        ("tvd", P_HALF, Q_QUARTER, 0.5),
    ],
)
def test_matches_hand_computed_values(kind, p, q, expected):
    assert divergence(kind, p, q).item() == pytest.approx(expected, abs=1e-6)


def test_rkl_floors_zero_target_mass():
    # q puts 0.5 on a token the target never produces: 0.25 ln(1/2) * 2 + 0.5 (ln 0.5 - floor)
    expected = 0.5 * math.log(0.5) + 0.5 * (math.log(0.5) - RKL_LOGPROB_FLOOR)
    assert divergence("rkl", P_HALF, Q_QUARTER).item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_zero_for_equal_and_positive_otherwise(kind):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 11, generator=g)
    logp = torch.log_softmax(logits, -1)
    assert divergence(kind, logp, logits + 3.0).item() == pytest.approx(0.0, abs=1e-6)  # shift-invariant
    other = torch.randn(7, 11, generator=g)
    assert divergence(kind, logp, other).item() > 1e-3


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_gradients_are_finite_with_zero_target_mass(kind):
    logits = torch.randn(4, 6, requires_grad=True)
    target = torch.full((4, 6), float("-inf"))
    target[:, :2] = math.log(0.5)          # top-2 target, the rest has no mass
    loss = divergence(kind, target, logits)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0


def test_mean_over_rows():
    rows = divergence("tvd", torch.cat([P_HALF, P_HALF.flip(-1)]), torch.cat([Q_QUARTER, P_HALF.flip(-1)]))
    assert rows.item() == pytest.approx(0.25, abs=1e-6)


def test_unknown_kind_suggests():
    with pytest.raises(BadInput, match="did you mean 'fkl'"):
        divergence("fk", P_HALF, Q_QUARTER)
