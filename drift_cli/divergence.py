"""Divergences between a target distribution and draft logits, written once.

    divergence(kind, target_logprobs [N, V], draft_logits [N, V]) -> scalar (mean over N rows)

p is the target (a fixed label: log-probabilities, possibly -inf where the target gives a token
no mass, e.g. a renormalised top-K), q = softmax(draft_logits) is being trained.

    fkl  KL(p || q) = sum_v p (log p - log q)          mode-covering; DistillSpec's choice for sampling
    rkl  KL(q || p) = sum_v q (log q - log p)          mode-seeking
    jsd  (KL(p || m) + KL(q || m)) / 2, m = (p + q)/2  bounded by log 2
    tvd  sum_v |p - q| / 2                             1 - TVD is the exact acceptance rate of one token

Numerical safety: terms with p = 0 contribute exactly 0 to fkl and jsd (0 log 0 = 0), never NaN,
also in the gradient. rkl is infinite when q > 0 where p = 0; there log p is floored at
`RKL_LOGPROB_FLOOR` (p ~ 1e-13), which keeps the loss finite and still pushes q off those tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from drift_cli.methods.settings import DIVERGENCES  # the names live with the --divergence flag


RKL_LOGPROB_FLOOR = -30.0


def _zero_where_no_mass(p: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    return torch.where(p > 0, terms, torch.zeros_like(terms))


def forward_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    p = logp.exp()
    safe_logp = torch.where(p > 0, logp, torch.zeros_like(logp))  # -inf -> 0 where p == 0
    return _zero_where_no_mass(p, p * (safe_logp - logq)).sum(-1)


def reverse_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    q = logq.exp()
    return (q * (logq - logp.clamp_min(RKL_LOGPROB_FLOOR))).sum(-1)


def jensen_shannon(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    # log m = log((p + q) / 2), computed in log space; finite because q > 0 everywhere.
    logm = torch.logaddexp(logp, logq) - math.log(2.0)
    q = logq.exp()
    return 0.5 * forward_kl(logp, logm) + 0.5 * (q * (logq - logm)).sum(-1)


def total_variation(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp.exp() - logq.exp()).abs().sum(-1)


_ROWWISE = {"fkl": forward_kl, "rkl": reverse_kl, "jsd": jensen_shannon, "tvd": total_variation}


def divergence(kind: str, target_logprobs: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of the divergence `kind` between target p and draft q; differentiable in q."""
    if kind not in _ROWWISE:
        from drift_cli.registry import unknown

        raise unknown("divergence", kind, DIVERGENCES)
    if target_logprobs.shape != draft_logits.shape:
        raise ValueError(f"shape mismatch: target {tuple(target_logprobs.shape)} vs draft {tuple(draft_logits.shape)}")
    logp = target_logprobs.float()
    logq = F.log_softmax(draft_logits.float(), dim=-1)
    return _ROWWISE[kind](logp, logq).mean()
