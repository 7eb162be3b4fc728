"""Dispatch: Triton on CUDA tensors, the Rust CPU path on CPU tensors, the PyTorch reference otherwise.

`backend="auto"` picks Triton for CUDA tensors (when Triton imports), the Rust CPU path
(`drift_kernels.cpu`) for CPU tensors, and the reference for anything else;
`backend="triton"` forces the kernels (tests do this on the CPU with TRITON_INTERPRET=1 set
before import), `"cpu"` the Rust path, `"reference"` the PyTorch reference.
Triton is imported lazily so the CPU path works on machines without it.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache

import torch

from drift_kernels import cpu, reference
from drift_kernels.reference import Neighbours

BACKENDS = ("auto", "triton", "cpu", "reference")


@lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        importlib.import_module("triton")
        return True
    except Exception:  # noqa: BLE001 - a broken Triton install means "use the reference"
        return False


def resolve(t: torch.Tensor, backend: str) -> str:
    """The concrete backend for a tensor: "triton", "cpu" or "reference"."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; expected one of {BACKENDS}")
    if backend != "auto":
        return backend
    if t.is_cuda:
        return "triton" if triton_available() else "reference"
    return "cpu" if t.device.type == "cpu" else "reference"


def use_triton(t: torch.Tensor, backend: str) -> bool:
    return resolve(t, backend) == "triton"


def retrieve(h, keys, valid, k: int, sigma: float, backend: str = "auto") -> Neighbours:
    """h [Q, d], keys [N, d] unit rows, valid [N] bool -> the k nearest (idx, sim, weight) [Q, k]."""
    path = resolve(h, backend)
    if path == "triton":
        from drift_kernels import retrieval
        return retrieval.retrieve(h, keys, valid, k, sigma)
    if path == "cpu":
        return cpu.retrieve(h, keys, valid, k, sigma)
    return reference.retrieve(h, keys, valid, k, sigma)


def bias_add(z, nb: Neighbours, support, bias, gain: float, backend: str = "auto") -> torch.Tensor:
    """z [Q, V] fp32 -> z + λβ (new tensor). support None means the full vocabulary (bias [N, V])."""
    path = resolve(z, backend)
    if path == "triton":
        from drift_kernels import bias as kernel
        if support is None:
            return kernel.bias_add_dense(z, nb, bias, gain)
        return kernel.bias_add(z, nb, support, bias, gain)
    if path == "cpu":
        return cpu.bias_add(z, nb, support, bias, gain)
    if support is None:
        return reference.bias_add_dense(z, nb, bias, gain)
    return reference.bias_add(z, nb, support, bias, gain)


def draft_step(h, z, keys, valid, support, bias, k: int, sigma: float, gain: float,
               backend: str = "auto") -> tuple[torch.Tensor, Neighbours]:
    """One draft step: retrieval then bias add. h [Q, d], z [Q, V] fp32 -> (z + λβ new [Q, V], the
    neighbours [Q, k]). On Triton one fused op in two launches (`drift_kernels.step`)."""
    if resolve(h, backend) == "triton":
        from drift_kernels import step
        return step.draft_step(h, z, keys, valid, support, bias, k, sigma, gain)
    nb = retrieve(h, keys, valid, k, sigma, backend=backend)
    return bias_add(z, nb, support, bias, gain, backend=backend), nb


def warm_up(device, d: int, m: int, k: int, dtype: torch.dtype, **shape) -> int:
    """Compile the Triton kernels the drift method launches at these shapes before a timed region
    (`drift_kernels.step.warm_up`; keyword arguments: bank_size, vocab, queries, positions,
    adaptive). A no-op returning 0 where the Triton path does not apply (not CUDA, no Triton),
    unless the Triton backend is forced by TRITON_INTERPRET=1 on the CPU. Returns the launches made."""
    dev = torch.device(device)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not triton_available() or (dev.type != "cuda" and not interpreted):
        return 0
    from drift_kernels import step
    return step.warm_up(dev, d, m, k, dtype, **shape)


def update(keys, bias, counts, slots, residual, h, eta: float, adaptive: bool, backend: str = "auto") -> None:
    """In-place EMA step of the matched prototypes, positions in order."""
    path = resolve(keys, backend)
    if path == "triton":
        from drift_kernels import prototype_update as kernel
        kernel.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    if path == "cpu":
        cpu.update(keys, bias, counts, slots, residual, h, eta, adaptive)
        return
    reference.update(keys, bias, counts, slots, residual, h, eta, adaptive)
