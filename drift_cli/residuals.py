"""The draft's error at rejected positions, and its singular-value spectrum (the DRIFT post's
"the top 16 directions captured most of the energy").

At every rejected position (each row's first rejection of an iteration) the residual
r = log p - log q between the target's and the static draft's distributions (temperature 1) over
the whole vocabulary is kept, up to a limit. The stacked residuals [R, V] are decomposed
(uncentred, and centred on their mean); `spectrum` gives the share of the energy (Σσ²) in the
top 16 directions, the effective rank, and the share a Gaussian matrix of the same shape would
put there. `vanilla --residuals N` records them in any bench or suite cell; `drift analyze
residuals` reports them with acceptance by entropy.
"""

from __future__ import annotations

import math

import torch

from drift_cli.errors import BadInput

TOP = 16            # the DRIFT post's "top 16 directions"
CURVE = 64          # singular values kept in run.json


class ResidualRecorder:
    """Residuals at the first rejected position of each row of each iteration, up to `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows: list[torch.Tensor] = []

    @torch.inference_mode()
    def observe(self, feedback) -> None:
        if self.limit <= 0 or feedback.proposal.base_logits is None:
            return
        for b, (k, a) in enumerate(zip(feedback.proposal.lengths, feedback.accepted.tolist(), strict=True)):
            if len(self.rows) >= self.limit:
                return
            if a >= k:          # nothing drafted, or every draft accepted: no rejection here
                continue
            logp = torch.log_softmax(feedback.target_logits[b, a].float(), dim=-1)
            logq = torch.log_softmax(feedback.proposal.base_logits[b, a].float(), dim=-1)
            self.rows.append((logp - logq).clamp(-30.0, 30.0).cpu())   # clip -inf from zero-mass tokens


def spectrum(rows: list[torch.Tensor], top: int = TOP) -> dict:
    """Singular-value statistics of the stacked residuals [R, V]."""
    if len(rows) < 2:
        raise BadInput(f"only {len(rows)} rejected positions: too few for a spectrum (use more prompts)")
    r = torch.stack(rows).double()
    out = {"residuals": r.shape[0], "vocab": r.shape[1]}
    for name, mat in (("uncentred", r), ("centred", r - r.mean(dim=0, keepdim=True))):
        s = torch.linalg.svdvals(mat)
        energy = s.pow(2)
        share = energy / energy.sum()
        probs = share[share > 0]
        out[name] = {
            f"energy_top{top}": float(share[:top].sum()),
            "effective_rank": float(math.exp(float(-(probs * probs.log()).sum()))),
            "cumulative_energy": share.cumsum(0)[:CURVE].tolist(),
            "singular_values": s[:CURVE].tolist(),
        }
    # reference: a Gaussian matrix of the same shape spreads energy evenly (top-16 share ~ 16 / min(R, V))
    out[f"isotropic_energy_top{top}"] = min(1.0, top / min(r.shape))
    return out
