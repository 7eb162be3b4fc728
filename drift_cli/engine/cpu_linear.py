"""Linear layers on the CPU at the weight-read floor: one read of W whatever the rows scored.

A forward that scores a few tokens (k tokens × B rows, M = k·B ≤ `MAX_ROWS`) is, on a CPU, a
read of the weights: the arithmetic of M ≤ 16 rows takes a fraction of the time the memory takes
to stream W. PyTorch's CPU GEMM changes kernels with M (at 4 rows on an AVX-512 Xeon) and the
step's cost jumps with it, which is a kernel's choice, not the hardware's. `install(model)`
routes every `nn.Linear` of a model through `drift_cli._bank.skinny_linear` (the Rust skinny
GEMM, `drift_bank_core::skinny`): W in its own [N, K] layout, never packed (OSD updates the
draft's weights in place), each output one dot product computed by the same operations whatever
M, so a position's outputs are bitwise identical scored alone or among other rows.

The choice is made once, when an engine wraps a model (`CausalLM`, `HeadDrafter`): the layers'
class becomes `SkinnyLinear` (still an `nn.Linear`, the same parameters and state dict). A call
takes the skinny path when its input is a float32 CPU tensor of at most `MAX_ROWS` rows and no
gradient is wanted (inference mode / no_grad, or a frozen weight); anything else (training with
autograd: OSD's backward steps, zoo builds; a prefill of many rows; CUDA; other dtypes) runs
`F.linear` exactly as before, and so does a process on more than `MAX_THREADS` torch threads (2:
the most measured, docs/engine.md). The kernel itself takes torch's thread count (read per call)
and shares the weight rows with a persistent pool of spinning workers in the extension.

`DRIFT_CPU_LINEAR=0` in the environment turns the path off (read when a model is wrapped): the
before/after measurement of `drift profile` and the tests use it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

ENV = "DRIFT_CPU_LINEAR"
MAX_ROWS = 32            # rows (tokens × batch rows) served by the skinny GEMM; more: F.linear
# The most torch threads the skinny path serves: 2, the most measured (docs/engine.md: on the
# 2-core EPYC two threads beat one at every k, and beat PyTorch's GEMM on two by 2.2x at k = 1).
# A linear call is ~0.1 ms of work, so the pool's workers spin between calls rather than sleep.
# More threads: F.linear.
MAX_THREADS = int(os.environ.get("DRIFT_CPU_LINEAR_MAX_THREADS", "2"))


def enabled() -> bool:
    """Whether the skinny path is switched on (the default)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def extension(name: str):
    """`drift_cli._bank.<name>`, or None where the extension is missing or was built before it."""
    try:
        from drift_cli import _bank
    except ImportError:
        return None
    return getattr(_bank, name, None)


_SKINNY = extension("skinny_linear")


def eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The skinny path serves this call: fp32 on the CPU, few rows, no gradient wanted (neither
    for the weight nor through the input: a frozen layer above trainable ones still backpropagates)."""
    return (x.dtype is torch.float32 and x.is_cpu and weight.dtype is torch.float32
            and not ((weight.requires_grad or x.requires_grad) and torch.is_grad_enabled())
            and 0 < x.numel() <= MAX_ROWS * x.shape[-1] and torch.get_num_threads() <= MAX_THREADS)


def skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] · weight [N, K]ᵀ (+ bias [N]) -> [..., N] by the skinny GEMM (no checks of
    eligibility: see `eligible`)."""
    x = x.contiguous()
    out = x.new_empty(*x.shape[:-1], weight.shape[0])
    _SKINNY(x, weight if weight.is_contiguous() else weight.contiguous(), bias, out, torch.get_num_threads())
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, by the skinny GEMM where `eligible` (and installed: `enabled()`)."""
    if _SKINNY is not None and eligible(x, weight):
        return skinny(x, weight, bias)
    return F.linear(x, weight, bias)


class SkinnyLinear(torch.nn.Linear):
    """An `nn.Linear` whose forward takes the skinny path where `eligible` (set by `install`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if eligible(x, w):
            return skinny(x, w, self.bias)
        return F.linear(x, w, self.bias)


def install(model: torch.nn.Module) -> int:
    """Route every plain `nn.Linear` of `model` through the skinny GEMM (once, at load); returns
    how many layers now do. Nothing changes when switched off, without the kernel, or for a model
    not on the CPU (the CUDA path stays as it was)."""
    if _SKINNY is None or not enabled():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.device.type == "cpu":
            module.__class__ = SkinnyLinear
            count += 1
        elif type(module) is SkinnyLinear:
            count += 1
    return count


def uninstall(model: torch.nn.Module) -> None:
    """Back to `nn.Linear` everywhere (before/after measurements in one process)."""
    for module in model.modules():
        if type(module) is SkinnyLinear:
            module.__class__ = torch.nn.Linear
