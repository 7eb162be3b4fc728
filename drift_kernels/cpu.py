"""The CPU fast path: the same ops as `reference`, in numpy on views of the CPU tensors.

On the CPU a DRIFT op is a few dozen tiny tensor operations, where PyTorch's per-call cost
(~5-10 µs) rather than arithmetic dominates; numpy's is ~1 µs. With the small built-in models
that decides whether DRIFT costs under 3% of an iteration. The reference stays the ground
truth: tests check the retrieved slots are identical, similarities and weights agree to fp32
rounding (the BLAS paths differ), and the bias add and update give bit-identical results from
the same inputs (same fp32 operations in the same order: neighbours j = 0..k-1 summed from 0).
All arrays are fp32 except ids; tensors are read and written in place through `.numpy()`.
"""

from __future__ import annotations

import numpy as np
import torch

from drift_kernels.reference import NORM_EPS, RESIDUAL_CLIP, Neighbours


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _f32(t: torch.Tensor) -> np.ndarray:
    return _np(t if t.dtype == torch.float32 else t.float())


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float) -> Neighbours:
    """h [Q, d]; keys [N, d]; valid [N] bool -> the k nearest, most similar first, ties to the lower slot.

    Similarities agree with the reference's to fp32 rounding (ĥ and the BLAS path differ), so
    only a near-tie within that rounding can order differently.
    """
    ok = _np(valid)
    idx, sim, w = _nearest(_f32(h), _f32(keys), None if ok.all() else ok, k, _inv_two_sigma_sq(sigma))
    dev = h.device
    return Neighbours(torch.from_numpy(idx).to(dev), torch.from_numpy(sim).to(dev), torch.from_numpy(w).to(dev))


def _inv_two_sigma_sq(sigma: float) -> np.float32:
    return np.float32(1.0 / (2.0 * sigma * sigma))


def _nearest(h: np.ndarray, keys: np.ndarray, valid: np.ndarray | None, k: int, inv: np.float32):
    """h [Q, d], keys [N, d] fp32, valid [N] bool or None (all valid) -> idx, sim, w [Q, k]."""
    q = h.shape[0]
    idx = np.full((q, k), -1, dtype=np.int64)
    sim = np.full((q, k), -np.inf, dtype=np.float32)
    w = np.zeros((q, k), dtype=np.float32)
    if keys.shape[0] == 0 or k == 0:
        return idx, sim, w
    for row in range(q):
        x = h[row]
        s = keys @ x                                                      # [N]
        s *= np.float32(1.0) / max(np.float32(np.sqrt(x @ x)), np.float32(NORM_EPS))
        if valid is not None:
            s[~valid] = -np.inf
        order = _top(s, k)
        top = s[order]
        live = np.isfinite(top)
        n = int(live.sum())
        idx[row, :n], sim[row, :n] = order[:n], top[:n]
        d = np.float32(1.0) - top[:n]
        w[row, :n] = np.exp(-(d * d) * inv)
    return idx, sim, w


def _top(s: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest of s [N] by (value desc, index asc)."""
    n = s.shape[0]
    if n <= k + 1:
        return np.argsort(-s, kind="stable")[:k]
    cand = np.argpartition(-s, k)[:k + 1]                              # the k+1 largest, unordered
    cand = cand[np.lexsort((cand, -s[cand]))]
    if s[cand[k - 1]] == s[cand[k]]:                                   # a tie at the boundary
        return np.argsort(-s, kind="stable")[:k]
    return cand[:k]


def _weight_total(w: np.ndarray) -> np.float32:
    total = np.float32(0.0)
    for x in w:                                                         # j = 0..k-1, fp32, in order
        total = np.float32(total + x)
    return max(total, np.float32(1.0))


def bias_add(z: torch.Tensor, nb: Neighbours, support: torch.Tensor | None, bias: torch.Tensor,
             gain: float) -> torch.Tensor:
    """z [Q, V] fp32 -> z + λβ (new tensor); support None means the full vocabulary (bias [N, V])."""
    out = z.clone()
    _bias_rows(_np(z), _np(out), _np(nb.idx), _np(nb.weight), None if support is None else _np(support),
               _np(bias), np.float32(gain))
    return out


def _bias_rows(z: np.ndarray, out: np.ndarray, idx: np.ndarray, w: np.ndarray, support: np.ndarray | None,
               bias: np.ndarray, gain: np.float32) -> None:
    """Write z + λβ into out (a copy of z) row by row, touching only the support positions."""
    for row in range(z.shape[0]):
        cols = np.flatnonzero(idx[row] >= 0)
        if cols.size == 0:
            continue
        den = _weight_total(w[row])
        acc = np.zeros(z.shape[1], dtype=np.float32)
        if support is None:
            for j in cols:
                acc = acc + w[row, j] * bias[idx[row, j]]
            out[row] = z[row] + gain * (acc / den)
            continue
        slots = idx[row, cols]
        touched = support[slots].ravel()                                # [n·m] in (j, t) order
        np.add.at(acc, touched, (w[row, cols, None] * bias[slots]).ravel())   # unbuffered, in order
        out[row, touched] = z[row, touched] + gain * (acc[touched] / den)


class BankView:
    """numpy views of a CPU bank's tensors (shared memory: in-place torch writes are seen), so a
    draft step costs one fused call: retrieval and bias add, ~20 numpy calls per query."""

    def __init__(self, keys: torch.Tensor, valid: torch.Tensor, support: torch.Tensor | None,
                 bias: torch.Tensor) -> None:
        assert keys.dtype == torch.float32 and keys.device.type == "cpu"
        self.keys, self.valid, self.bias = _np(keys), _np(valid), _np(bias)
        self.support = None if support is None else _np(support)

    def adjust(self, h: torch.Tensor, z: torch.Tensor, hi: int, all_valid: bool, k: int, sigma: float,
               gain: float) -> tuple[torch.Tensor, Neighbours]:
        """h [Q, d], z [Q, V] fp32 -> (z + λβ, the neighbours); scans slots [0, hi)."""
        zs = _np(z)
        out = zs.copy()
        idx, sim, w = _nearest(_f32(h), self.keys[:hi], None if all_valid else self.valid[:hi], k,
                               _inv_two_sigma_sq(sigma))
        if gain != 0.0:
            _bias_rows(zs, out, idx, w, self.support, self.bias, np.float32(gain))
        nb = Neighbours(torch.from_numpy(idx), torch.from_numpy(sim), torch.from_numpy(w))
        return torch.from_numpy(out), nb


def update(keys: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor,
           residual: torch.Tensor, h: torch.Tensor, eta: float, adaptive: bool) -> None:
    """In place, positions in order: the reference's EMA step (fp32 keys; other key dtypes via torch)."""
    if keys.dtype != torch.float32:
        from drift_kernels import reference
        reference.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    update_rows(_np(keys), _np(bias), _np(counts), _np(slots), _f32(residual), _f32(h), eta, adaptive)


def update_rows(keys: np.ndarray, bias: np.ndarray, counts: np.ndarray, slots, residual: np.ndarray,
                h: np.ndarray, eta: float, adaptive: bool) -> None:
    """The EMA step on numpy arrays (views of the bank), positions in order."""
    hn = h / np.maximum(np.sqrt(np.einsum("pd,pd->p", h, h)), np.float32(NORM_EPS))[:, None]
    for p, slot in enumerate(np.asarray(slots).tolist()):
        rate64 = max(eta, 1.0 / (float(counts[slot]) + 1.0)) if adaptive else eta
        rate, keep = np.float32(rate64), np.float32(1.0 - rate64)      # as torch rounds Python scalars
        bias[slot] = keep * bias[slot] + rate * residual[p]
        key = keep * keys[slot] + rate * hn[p]
        keys[slot] = key / max(np.float32(np.sqrt(key @ key)), np.float32(NORM_EPS))
        counts[slot] += 1


def support_residual(logp: np.ndarray, logq: np.ndarray, support: np.ndarray) -> np.ndarray:
    """numpy twin of `reference.support_residual`: [P, V] log-probs, [P, m] ids -> [P, m]."""
    lp = np.take_along_axis(logp, support, axis=1)
    lq = np.take_along_axis(logq, support, axis=1)
    r = (lp - _logsumexp(lp)) - (lq - _logsumexp(lq))
    return np.clip(r, -RESIDUAL_CLIP, RESIDUAL_CLIP).astype(np.float32, copy=False)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, np.float32(0.0))
    return np.log(np.exp(x - top).sum(axis=1, keepdims=True)) + top
