"""The EMA update of matched prototypes in Triton, one program walking the positions in order.

A slot may be matched by several positions of one iteration, so positions are applied
sequentially (the bank state after position p is the input of position p+1); each position is
a handful of vectorised passes over its prototype's row (m bias values, d key entries), with a
barrier between positions so the next one reads what this one wrote. P = B·γ is small. The
loop bounds P, m, d are constexprs (a handful of compilations: P takes at most γ·B values), which
also keeps the Triton 3.6 interpreter working under numpy >= 2.4. Constants enter as constexpr
parameters (`NORM_EPS`, defined once in `reference.py`): a jitted function reads no module global.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drift_kernels.reference import NORM_EPS


@triton.jit
def _update_kernel(keys_ptr, bias_ptr, counts_ptr, slots_ptr, res_ptr, h_ptr,
                   eta, NORM_EPS: tl.constexpr, P: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                   ADAPTIVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    for p in range(P):
        slot = tl.load(slots_ptr + p).to(tl.int64)
        n = tl.load(counts_ptr + slot)
        rate = eta
        if ADAPTIVE:
            rate = tl.maximum(eta, 1.0 / (n.to(tl.float32) + 1.0))
        keep = 1.0 - rate
        # bias: B_i <- (1 - η_i) B_i + η_i r                                   [m]
        for m0 in range(0, M, BLOCK_M):
            ms = m0 + tl.arange(0, BLOCK_M)
            b = tl.load(bias_ptr + slot * M + ms, mask=ms < M, other=0.0)
            r = tl.load(res_ptr + p * M + ms, mask=ms < M, other=0.0)
            tl.store(bias_ptr + slot * M + ms, keep * b + rate * r, mask=ms < M)
        # key: K_i <- normalise((1 - η_i) K_i + η_i ĥ): |h|, then |new key|, then the write [d]
        hsq = 0.0
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            h = tl.load(h_ptr + p * D + ds, mask=ds < D, other=0.0).to(tl.float32)
            hsq += tl.sum(h * h, axis=0)
        hnorm = tl.maximum(tl.sqrt(hsq), NORM_EPS)
        ksq = 0.0
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            h = tl.load(h_ptr + p * D + ds, mask=ds < D, other=0.0).to(tl.float32)
            key = tl.load(keys_ptr + slot * D + ds, mask=ds < D, other=0.0).to(tl.float32)
            new = keep * key + rate * (h / hnorm)
            ksq += tl.sum(new * new, axis=0)
        knorm = tl.maximum(tl.sqrt(ksq), NORM_EPS)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            h = tl.load(h_ptr + p * D + ds, mask=ds < D, other=0.0).to(tl.float32)
            key = tl.load(keys_ptr + slot * D + ds, mask=ds < D, other=0.0).to(tl.float32)
            new = (keep * key + rate * (h / hnorm)) / knorm
            tl.store(keys_ptr + slot * D + ds, new.to(keys_ptr.dtype.element_ty), mask=ds < D)
        tl.store(counts_ptr + slot, n + 1)
        tl.debug_barrier()


def update(keys: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor,
           residual: torch.Tensor, h: torch.Tensor, eta: float, adaptive: bool) -> None:
    """Launcher (in place). keys [N, d]; bias [N, m] fp32; counts [N]; slots [P]; residual [P, m]; h [P, d]."""
    p = slots.shape[0]
    if p == 0:
        return
    assert keys.is_contiguous() and bias.is_contiguous() and counts.is_contiguous()
    m, d = bias.shape[1], keys.shape[1]
    _update_kernel[(1,)](
        keys, bias, counts, slots.contiguous(), residual.contiguous().float(), h.contiguous(),
        float(eta), NORM_EPS=NORM_EPS, P=p, M=m, D=d, ADAPTIVE=bool(adaptive),
        BLOCK_M=min(1024, triton.next_power_of_2(max(m, 1))), BLOCK_D=min(1024, triton.next_power_of_2(d)),
        enable_fp_fusion=False)
