"""The CPU path: DRIFT's ops in Rust (`drift_cli._bank`, core module `kernels.rs`) on numpy
views of the CPU tensors.

On the CPU a DRIFT step is a few hundred kilo-FLOPs spread over dozens of tiny operations; with
PyTorch (~5-10 µs a call) or numpy (~1-5 µs) the per-call cost, not arithmetic, decided the
overhead (12-15% of an iteration with the small zoo). Here a draft step (retrieval fused with the
bias add) is one call, and so is an iteration's whole update (books included).
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


def f32_array(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A C-contiguous fp32 numpy array of a CPU tensor or an array (a view when it already is one)."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t, dtype=np.float32)
    if t.dtype != torch.float32 or t.requires_grad:
        t = t.detach().float()
    return np.ascontiguousarray(t.numpy())


def _i64(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(_np(t), dtype=np.int64)


def inv_two_sigma_sq(sigma: float) -> np.float32:
    return np.float32(1.0 / (2.0 * sigma * sigma))


def _no_neighbours(rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.full((rows, k), -1, dtype=np.int64), np.full((rows, k), -np.inf, dtype=np.float32),
            np.zeros((rows, k), dtype=np.float32))


def _neighbours(idx: np.ndarray, sim: np.ndarray, w: np.ndarray, device) -> Neighbours:
    return Neighbours(torch.from_numpy(idx).to(device), torch.from_numpy(sim).to(device),
                      torch.from_numpy(w).to(device))


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float) -> Neighbours:
    """h [Q, d]; keys [N, d]; valid [N] bool -> the k nearest, most similar first, ties to the lower slot."""
    ok = _np(valid)
    idx, sim, w = _ext().drift_retrieve(f32_array(keys), None if ok.all() else ok, f32_array(h), keys.shape[0], k,
                                        inv_two_sigma_sq(sigma))
    return _neighbours(idx, sim, w, h.device)


def bias_add(z: torch.Tensor, nb: Neighbours, support: torch.Tensor | None, bias: torch.Tensor,
             gain: float) -> torch.Tensor:
    """z [Q, V] fp32 -> z + λβ (new tensor); support None means the full vocabulary (bias [N, V])."""
    out = _ext().drift_bias_add(f32_array(z), _i64(nb.idx), f32_array(nb.weight),
                                None if support is None else _i64(support), f32_array(bias), gain)
    return torch.from_numpy(out)


def update(keys: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor,
           residual: torch.Tensor, h: torch.Tensor, eta: float, adaptive: bool) -> None:
    """In place, positions in order: the reference's EMA step (fp32 keys; other key dtypes via torch)."""
    if keys.dtype != torch.float32:
        from drift_kernels import reference
        reference.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    _ext().drift_ema(_np(keys), _np(bias), _np(counts), _np(slots).tolist(), f32_array(residual), f32_array(h), eta, adaptive)


class BankView:
    """numpy views of a CPU bank's fp32 tensors (shared memory: in-place torch writes are seen
    and vice versa), with the bank's steps as one Rust call each. The draft steps of one
    iteration write their retrievals into the view's own buffers (rows in draft order), which
    `pending` hands to the update: no per-token arrays."""

    def __init__(self, keys: torch.Tensor, valid: torch.Tensor, support: torch.Tensor | None,
                 bias: torch.Tensor, counts: torch.Tensor, k: int) -> None:
        assert keys.dtype == torch.float32 and keys.device.type == "cpu"
        self.keys, self.valid, self.bias, self.counts = _np(keys), _np(valid), _np(bias), _np(counts)
        self.support = None if support is None else _np(support)
        self.ext = _ext()
        self._step = self.ext.drift_draft_step
        self.k, self.rows = k, 0
        self.idx, self.sim, self.weight = _no_neighbours(16, k)
        self._out: dict[tuple[int, int], tuple[np.ndarray, torch.Tensor]] = {}   # (Q, V) -> output buffer

    def begin(self) -> None:
        """A new proposal: forget the retrievals of the last one."""
        self.rows = 0

    def _reserve(self, q: int) -> int:
        """Room for q more draft rows (the buffers double when full); returns the first row."""
        r = self.rows
        if r + q > len(self.idx):
            grown = _no_neighbours(2 * (r + q), self.k)
            for old, new in zip((self.idx, self.sim, self.weight), grown):
                new[:r] = old[:r]
            self.idx, self.sim, self.weight = grown
        self.rows = r + q
        return r

    def adjust(self, h: torch.Tensor, z: torch.Tensor, hi: int, all_valid: bool, inv: np.float32,
               gain: float) -> torch.Tensor:
        """h [Q, d], z [Q, V] fp32 -> z + λβ; scans slots [0, hi) and records the retrievals.
        inv = 1 / (2σ²) as fp32 (`inv_two_sigma_sq`). (The per-token path: kept to one call.)

        The result lives in a buffer the view reuses: it is valid until the next `adjust` (the
        engine draws the token from it at once). A fresh 16-500 KB array per draft token made
        the allocator consolidate its free lists, measurably, next to the models' allocations."""
        q = h.shape[0]
        r = self._reserve(q)
        buf = self._out.get(z.shape)
        if buf is None:
            arr = np.empty(tuple(z.shape), dtype=np.float32)
            buf = self._out[tuple(z.shape)] = (arr, torch.from_numpy(arr))
        self._step(self.keys, None if all_valid else self.valid, self.support, self.bias, f32_array(h), f32_array(z),
                   hi, inv, gain, self.idx[r:r + q], self.sim[r:r + q], self.weight[r:r + q], buf[0])
        return buf[1]

    def skip(self, q: int) -> None:
        """Q draft rows without a retrieval (an empty bank)."""
        r = self._reserve(q)
        self.idx[r:r + q], self.sim[r:r + q], self.weight[r:r + q] = -1, -np.inf, 0.0

    def pending(self, b: int, steps: int) -> Neighbours:
        """The first `steps` draft steps' retrievals for a batch of b, as [b·steps, k] batch-major
        (rows were recorded step-major)."""
        n = b * steps
        assert n <= self.rows, "fewer draft rows recorded than positions to update"
        if b == 1:
            return Neighbours(self.idx[:n], self.sim[:n], self.weight[:n])
        order = lambda x: np.ascontiguousarray(x[:n].reshape(steps, b, self.k).transpose(1, 0, 2)).reshape(n, self.k)  # noqa: E731
        return Neighbours(order(self.idx), order(self.sim), order(self.weight))

    def owns(self, books) -> bool:
        """Whether `observe` can drive these books (the extension's own `Books`)."""
        return isinstance(books, self.ext.Books)

    def observe(self, books, tenant: str, h: np.ndarray, logp: np.ndarray, logq: np.ndarray, idx: np.ndarray,
                sim: np.ndarray, weight: np.ndarray, tau: float, eta: float, adaptive: bool, used_weight: float):
        """One iteration's update with the books, in place (see `kernels.rs::observe`). h [P, d],
        logp/logq [P, V] fp32, idx/sim/weight [P, k] the draft step's retrievals.
        Returns (updated, refreshed, evicted, [(position, slot)] allocated, slots made valid)."""
        return self.ext.drift_observe(books, tenant, self.keys, self.support, self.bias, self.counts, self.valid,
                                      h, logp, logq, idx, sim, weight, tau, eta, adaptive, used_weight)
