"""Dispatch: Triton on CUDA tensors, the PyTorch reference elsewhere.

`backend="auto"` picks Triton for CUDA tensors (when Triton imports) and the reference
otherwise; `backend="triton"` forces the kernels (tests do this on the CPU with
TRITON_INTERPRET=1 set before import); `backend="reference"` forces the reference.
Triton is imported lazily so the CPU path works on machines without it.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch

from drift_kernels import reference
from drift_kernels.reference import Neighbours

BACKENDS = ("auto", "triton", "reference")


@lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        importlib.import_module("triton")
        return True
    except Exception:  # noqa: BLE001 - a broken Triton install means "use the reference"
        return False


def use_triton(t: torch.Tensor, backend: str) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        return t.is_cuda and triton_available()
    return backend == "triton"


def retrieve(h, keys, valid, k: int, sigma: float, backend: str = "auto") -> Neighbours:
    """h [Q, d], keys [N, d] unit rows, valid [N] bool -> the k nearest (idx, sim, weight) [Q, k]."""
    if use_triton(h, backend):
        from drift_kernels import retrieval
        return retrieval.retrieve(h, keys, valid, k, sigma)
    return reference.retrieve(h, keys, valid, k, sigma)


def bias_add(z, nb: Neighbours, support, bias, gain: float, backend: str = "auto") -> torch.Tensor:
    """z [Q, V] fp32 -> z + λβ (new tensor). support None means the full vocabulary (bias [N, V])."""
    if use_triton(z, backend):
        from drift_kernels import bias as kernel
        if support is None:
            return kernel.bias_add_dense(z, nb, bias, gain)
        return kernel.bias_add(z, nb, support, bias, gain)
    if support is None:
        return reference.bias_add_dense(z, nb, bias, gain)
    return reference.bias_add(z, nb, support, bias, gain)


def update(keys, bias, counts, slots, residual, h, eta: float, adaptive: bool, backend: str = "auto") -> None:
    """In-place EMA step of the matched prototypes, positions in order."""
    if use_triton(keys, backend):
        from drift_kernels import prototype_update as kernel
        kernel.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    reference.update(keys, bias, counts, slots, residual, h, eta, adaptive)
