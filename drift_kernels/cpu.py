"""The CPU path: DRIFT's ops in Rust (`drift_cli._bank`; core modules `kernels.rs` and
`cpu_bank.rs` of `rust/bank-core`) on numpy views of the CPU tensors.

On the CPU a DRIFT step is a few hundred kilo-FLOPs spread over dozens of tiny operations; with
PyTorch or numpy the per-call cost, not arithmetic, decided the overhead (docs/drift.md has the
measurements). Here a bank's `CpuBank` (Rust) makes a draft step (retrieval fused with the
bias add) one call taking three arrays, and an iteration's whole update (books included) one
call. The reference (`drift_kernels.reference`, including its whole-update `observe`) is the
specification: tests check the retrieved slots are identical, similarities and weights agree to
fp32 rounding (the dot products sum in another order), and the bias add, the EMA step and the
update give bit-identical results from the same inputs (same fp32 operations in the same
order). Tensors are read and written in place through `.numpy()` (shared memory).
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


def owns(books) -> bool:
    """Are these the extension's own `Books` (which a `CpuBank` needs: it reads the extent and
    runs the update on them in Rust)?"""
    return isinstance(books, _ext().Books)


def bank(keys: torch.Tensor, valid: torch.Tensor, support: torch.Tensor | None, bias: torch.Tensor,
         counts: torch.Tensor, books, tenant: str, k: int, sigma: float, gain: float, tau: float, eta: float,
         adaptive: bool, used_weight: float):
    """The Rust `CpuBank` over these fp32 CPU tensors' memory (numpy views; in-place torch writes
    are seen and vice versa) and the extension's `books`: a draft step (retrieval + bias add,
    recorded) is one call with three arrays, an iteration's update one call. See `_bank.pyi`."""
    assert keys.dtype == torch.float32 and keys.device.type == "cpu"
    return _ext().CpuBank(_np(keys), _np(valid), None if support is None else _np(support), _np(bias), _np(counts),
                          books, tenant, k, float(inv_two_sigma_sq(sigma)), gain, tau, eta, adaptive, used_weight)


def host_f32(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor as fp32 for the Rust side, which reads fp32 tensors in place at any strides
    (other dtypes converted)."""
    return t if t.dtype == torch.float32 else t.float()
