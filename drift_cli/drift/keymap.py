"""`--key target-est`: prototypes keyed on an estimate of the target's hidden state.

A ridge map W [(d_in+1), d_out] takes the draft's hidden state h (the lm_head input that
predicts x_{i+1}) to the target's hidden state at the same position (Feedback.target_hidden[:, i]):
    ŷ = [h, 1] · W,      W = (XᵀX + ρ·D)⁻¹ XᵀY,   D = diag(1, ..., 1, 0) (the intercept is free)
XᵀX and XᵀY are sufficient statistics accumulated in float64 from every drafted position's
(draft, target) pair, so a refit costs one (d_in+1)² solve whatever the stream length.
ρ = RIDGE × (mean diagonal of XᵀX over the d_in features) / n: the penalty weighs like RIDGE
pseudo-pairs of average energy, so it suits hidden states of any scale and fades as pairs
accumulate (strong at the first fit on 256 pairs, ~1% of the data term after a few thousand).

Schedule: the first fit once WARMUP pairs were seen, then a refit each time another
REFIT_EVERY pairs arrived (checked after each iteration's pairs are added, so a fit uses every
pair seen so far). Before the first fit there is no key space: the tenant's bank does not
exist yet (no bias, no allocation), only pairs are collected.

Re-keying: a prototype's key was made with the map of its time. Each bank keeps a draft-space
shadow S [N, d_in] per prototype: the raw draft state at allocation, then the same EMA with the
same per-prototype rate η_i as the key, but without renormalising. The EMA weights sum to 1, so
W·[S, 1] is exactly the same EMA of the mapped states under the current W. On refit every
valid key becomes unit(W·[S, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drift_kernels.reference import NORM_EPS, unit_rows

RIDGE = 32.0        # ρ in pseudo-pairs of mean feature energy (see above; chosen on jargon dev, docs/drift.md)
WARMUP = 256        # pairs (drafted positions) before the first fit
REFIT_EVERY = 256   # pairs between refits


@dataclass(frozen=True)
class KeyMapSpec:
    ridge: float = RIDGE
    refit_every: int = REFIT_EVERY
    warmup: int = WARMUP

    def __post_init__(self) -> None:
        if self.ridge <= 0.0 or self.refit_every < 1 or self.warmup < 1:
            raise ValueError(f"key map needs ridge > 0, refit_every >= 1, warmup >= 1: {self}")


class RidgeKeyMap:
    """Draft hidden state [Q, d_in] -> estimated target hidden state [Q, d_out]."""

    @torch.inference_mode()
    def __init__(self, d_in: int, d_out: int, ridge: float = RIDGE, refit_every: int = REFIT_EVERY,
                 warmup: int = WARMUP, device: torch.device | str = "cpu") -> None:
        KeyMapSpec(ridge, refit_every, warmup)          # validates
        self.d_in, self.d_out, self.ridge = d_in, d_out, ridge
        self.refit_every, self.warmup = refit_every, warmup
        self.xtx = torch.zeros(d_in + 1, d_in + 1, dtype=torch.float64, device=device)   # [(d+1), (d+1)]
        self.xty = torch.zeros(d_in + 1, d_out, dtype=torch.float64, device=device)      # [(d+1), d_out]
        self.weight: torch.Tensor | None = None   # [d_in, d_out] fp32, the slopes
        self.intercept: torch.Tensor | None = None  # [d_out] fp32
        self.seen = 0             # pairs accumulated
        self.fitted_at: list[int] = []  # `seen` at each fit
        self.next_fit = warmup

    @property
    def fitted(self) -> bool:
        return self.weight is not None

    @torch.inference_mode()
    def add(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """x [P, d_in] draft states, y [P, d_out] target states. Returns whether it refitted."""
        if x.shape[0] == 0:
            return False
        x1 = torch.cat([x.double(), x.new_ones(x.shape[0], 1, dtype=torch.float64)], dim=1)   # [P, d_in+1]
        self.xtx.addmm_(x1.T, x1)
        self.xty.addmm_(x1.T, y.double())
        self.seen += x.shape[0]
        if self.seen < self.next_fit:
            return False
        self.fit()
        return True

    @torch.inference_mode()
    def fit(self) -> None:
        """W = (XᵀX + ρ·diag(1..1, 0))⁻¹ XᵀY in float64; the next refit REFIT_EVERY pairs later."""
        d = self.d_in
        energy = (torch.diagonal(self.xtx)[:d].mean() / self.seen).clamp_min(NORM_EPS)   # mean x² per pair
        penalty = torch.full((d + 1,), float(self.ridge), dtype=torch.float64, device=self.xtx.device) * energy
        penalty[d] = 0.0                                                     # the intercept is not regularised
        w = torch.linalg.solve(self.xtx + torch.diag(penalty), self.xty)     # [(d+1), d_out]
        self.weight, self.intercept = w[:d].float(), w[d].float()
        self.fitted_at.append(self.seen)
        while self.next_fit <= self.seen:
            self.next_fit += self.refit_every

    def map(self, h: torch.Tensor) -> torch.Tensor:
        """h [Q, d_in] any float dtype -> [Q, d_out] fp32: one addmm (the intercept rides along)."""
        assert self.weight is not None and self.intercept is not None, "the key map is not fitted yet"
        return torch.addmm(self.intercept, h.float(), self.weight)

    def memory_bytes(self) -> int:
        tensors = [self.xtx, self.xty] + [t for t in (self.weight, self.intercept) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def stats(self) -> dict:
        return {"pairs": self.seen, "fits": len(self.fitted_at), "fitted_at": list(self.fitted_at),
                "ridge": self.ridge, "warmup": self.warmup, "refit_every": self.refit_every,
                "memory_bytes": self.memory_bytes()}


class DraftShadow:
    """Per prototype slot, the draft-space state its key stands for: S [N, d_in] fp32.

    Allocation sets S_i = h; an update S_i <- (1 - η_i) S_i + η_i h with the rate η_i the bank's
    update used (`Observed.rates`). No renormalisation, so W·[S_i, 1] equals the EMA of the
    mapped states.
    """

    @torch.inference_mode()
    def __init__(self, slots: int, d_in: int, device: torch.device | str = "cpu") -> None:
        self.states = torch.zeros(slots, d_in, dtype=torch.float32, device=device)
        # on the CPU the per-position steps run on a numpy view (cheaper than tensor indexing per step)
        self._host = self.states.numpy() if self.states.device.type == "cpu" else None

    @torch.inference_mode()
    def update(self, matched: list[tuple[int, int]], rates: list[float], h: torch.Tensor) -> None:
        """The bank's matched (position, slot) pairs in order, at the EMA rates its update used."""
        states, hs = (self._host, h.float().numpy()) if self._host is not None else (self.states, h.float())
        for (p, slot), rate in zip(matched, rates, strict=True):
            states[slot] = (1.0 - rate) * states[slot] + rate * hs[p]

    @torch.inference_mode()
    def allocate(self, allocations: list[tuple[int, int]], h: torch.Tensor) -> None:
        """The bank's (position, slot) allocations in order (a slot handed out twice keeps the last
        position, as the bank does)."""
        states, hs = (self._host, h.float().numpy()) if self._host is not None else (self.states, h.float())
        for p, slot in allocations:
            states[slot] = hs[p]

    @torch.inference_mode()
    def rekey(self, keys: torch.Tensor, valid: torch.Tensor, keymap: RidgeKeyMap) -> int:
        """keys [N, d_out] in place: every valid row becomes unit(W·[S, 1]). Returns the rows re-keyed."""
        rows = valid.nonzero().squeeze(1)                                  # [R]
        if rows.numel():
            keys[rows] = unit_rows(keymap.map(self.states[rows])).to(keys.dtype)
        return int(rows.numel())

    def memory_bytes(self) -> int:
        return self.states.numel() * self.states.element_size()
