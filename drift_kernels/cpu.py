"""The CPU path: DRIFT's ops in Rust (`drift_cli._bank`, core module `kernels.rs`) on numpy
views of the CPU tensors.

On the CPU a DRIFT step is a few hundred kilo-FLOPs spread over dozens of tiny operations; with
PyTorch (~5-10 µs a call) or numpy (~1-5 µs) the per-call cost, not arithmetic, decided the
overhead (12-15% of an iteration with the small zoo). Here a draft step (retrieval fused with the
bias add) is one call, and so is each half of the update (matched EMA updates; allocations).
The reference stays the ground truth: tests check the retrieved slots are identical,
similarities and weights agree to fp32 rounding (the dot products sum in another order), and the
bias add and the EMA step give bit-identical results from the same inputs (same fp32 operations
in the same order). Tensors are read and written in place through `.numpy()` (shared memory).
"""

from __future__ import annotations

import numpy as np
import torch

from drift_kernels.reference import Neighbours


_BANK = None


def _ext():
    """The Rust extension (maturin), imported on first use and kept."""
    global _BANK
    if _BANK is None:
        from drift_cli import _bank
        _BANK = _bank
    return _BANK


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _f32(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous fp32 numpy array of a CPU tensor (a view when it already is one)."""
    return np.ascontiguousarray(_np(t if t.dtype == torch.float32 else t.float()))


def _i64(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(_np(t), dtype=np.int64)


def inv_two_sigma_sq(sigma: float) -> np.float32:
    return np.float32(1.0 / (2.0 * sigma * sigma))


def _neighbours(idx: np.ndarray, sim: np.ndarray, w: np.ndarray, device) -> Neighbours:
    return Neighbours(torch.from_numpy(idx).to(device), torch.from_numpy(sim).to(device),
                      torch.from_numpy(w).to(device))


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float) -> Neighbours:
    """h [Q, d]; keys [N, d]; valid [N] bool -> the k nearest, most similar first, ties to the lower slot."""
    ok = _np(valid)
    idx, sim, w = _ext().drift_retrieve(_f32(keys), None if ok.all() else ok, _f32(h), keys.shape[0], k,
                                        inv_two_sigma_sq(sigma))
    return _neighbours(idx, sim, w, h.device)


def bias_add(z: torch.Tensor, nb: Neighbours, support: torch.Tensor | None, bias: torch.Tensor,
             gain: float) -> torch.Tensor:
    """z [Q, V] fp32 -> z + λβ (new tensor); support None means the full vocabulary (bias [N, V])."""
    out = _ext().drift_bias_add(_f32(z), _i64(nb.idx), _f32(nb.weight),
                                None if support is None else _i64(support), _f32(bias), gain)
    return torch.from_numpy(out)


def update(keys: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor,
           residual: torch.Tensor, h: torch.Tensor, eta: float, adaptive: bool) -> None:
    """In place, positions in order: the reference's EMA step (fp32 keys; other key dtypes via torch)."""
    if keys.dtype != torch.float32:
        from drift_kernels import reference
        reference.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    _ext().drift_ema(_np(keys), _np(bias), _np(counts), _np(slots).tolist(), _f32(residual), _f32(h), eta, adaptive)


class BankView:
    """numpy views of a CPU bank's fp32 tensors (shared memory: in-place torch writes are seen
    and vice versa), with the bank's three steps as one Rust call each."""

    def __init__(self, keys: torch.Tensor, valid: torch.Tensor, support: torch.Tensor | None,
                 bias: torch.Tensor, counts: torch.Tensor) -> None:
        assert keys.dtype == torch.float32 and keys.device.type == "cpu"
        self.keys, self.valid, self.bias, self.counts = _np(keys), _np(valid), _np(bias), _np(counts)
        self.support = None if support is None else _np(support)
        self.ext = _ext()

    def adjust(self, h: torch.Tensor, z: torch.Tensor, hi: int, all_valid: bool, k: int, inv: np.float32,
               gain: float) -> tuple[torch.Tensor, Neighbours]:
        """h [Q, d], z [Q, V] fp32 -> (z + λβ, the neighbours); scans slots [0, hi).
        inv = 1 / (2σ²) as fp32 (`inv_two_sigma_sq`)."""
        out, idx, sim, w = self.ext.drift_draft_step(
            self.keys, None if all_valid else self.valid, self.support, self.bias, _f32(h), _f32(z), hi, k, inv, gain)
        return torch.from_numpy(out), Neighbours(torch.from_numpy(idx), torch.from_numpy(sim), torch.from_numpy(w))

    def update(self, pos: list[int], slots: list[int], h: np.ndarray, logp: np.ndarray, logq: np.ndarray,
               eta: float, adaptive: bool) -> int:
        """Matched updates, (position, slot) pairs in order: support refresh, residual on the
        support, EMA. h [P, d], logp/logq [P, V] fp32 C-contiguous. Returns the refreshes."""
        return self.ext.drift_update(self.keys, self.support, self.bias, self.counts, h, logp, logq, pos, slots,
                                   eta, adaptive)

    def allocate(self, pos: list[int], slots: list[int], h: np.ndarray, logp: np.ndarray,
                 logq: np.ndarray) -> None:
        """New prototypes in the given slots: K = ĥ, S = top-m of max(p, q), B = r on S, n = 1."""
        self.ext.drift_allocate(self.keys, self.support, self.bias, self.counts, h, logp, logq, pos, slots)
