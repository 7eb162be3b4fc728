"""Bias add in Triton: z' = z + λ · Σ_j w_j scatter_V(S_j, B_j) / max(1, Σ_j w_j).

Sparse support (m > 0), grid (Q,): the output starts as a copy of z and each program writes only
the k·m support positions of its query. For every position (j, t) it sums w_j' · B_j'[t'] over
the neighbours j' = 0..k-1 in order whose support holds the same token (at most one t' per row,
since support ids are unique within a row), so a token shared by several prototypes gets the
same value at each of its positions, and the fp32 sum is bit-identical to the reference's
scatter_add order. Division is IEEE (`div_rn`) and FMA contraction is disabled at launch.
Dense support (m = 0, B [N, V]), grid (Q, V blocks): the same sum for every vocabulary entry.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drift_kernels.reference import Neighbours


@triton.jit
def _weight_total(w_ptr, q, K: tl.constexpr):
    total = tl.load(w_ptr + q * K) * 0.0
    for j in tl.static_range(K):
        total = total + tl.load(w_ptr + q * K + j)
    return tl.maximum(total, 1.0)


@triton.jit
def _sparse_bias_kernel(z_ptr, out_ptr, idx_ptr, w_ptr, sup_ptr, bias_ptr, M, V, gain,
                        K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    js = tl.arange(0, BLOCK_K)
    ts = tl.arange(0, BLOCK_M)
    slots = tl.load(idx_ptr + q * K + js, mask=js < K, other=-1)                      # [BK]
    here = (slots[:, None] >= 0) & (ts[None, :] < M)
    tok = tl.load(sup_ptr + slots[:, None] * M + ts[None, :], mask=here, other=-1)   # [BK, BM]
    acc = tl.zeros([BLOCK_K, BLOCK_M], dtype=tl.float32)
    for jj in tl.static_range(K):
        slot = tl.load(idx_ptr + q * K + jj)
        w = tl.load(w_ptr + q * K + jj)
        slot_row = tl.full([BLOCK_M], 0, tl.int64) + slot                             # [BM]
        row_ok = (ts < M) & (slot_row >= 0)
        row_tok = tl.load(sup_ptr + slot * M + ts, mask=row_ok, other=-2)             # [BM]
        row_b = tl.load(bias_ptr + slot * M + ts, mask=row_ok, other=0.0)
        match = tok[:, :, None] == row_tok[None, None, :]                              # [BK, BM, BM]
        val = tl.sum(tl.where(match, row_b[None, None, :], 0.0), axis=2)               # one term or 0
        acc = acc + w * val
    total = _weight_total(w_ptr, q, K)
    live = here & (tok >= 0) & (tok < V)
    z = tl.load(z_ptr + q * V + tok, mask=live, other=0.0)
    tl.store(out_ptr + q * V + tok, z + gain * tl.math.div_rn(acc, total), mask=live)


@triton.jit
def _dense_bias_kernel(z_ptr, out_ptr, idx_ptr, w_ptr, bias_ptr, V,
                       K: tl.constexpr, BLOCK_V: tl.constexpr, gain):
    q = tl.program_id(0).to(tl.int64)
    vs = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = vs < V
    acc = tl.zeros([BLOCK_V], dtype=tl.float32)
    for j in tl.static_range(K):
        slot = tl.load(idx_ptr + q * K + j)
        w = tl.load(w_ptr + q * K + j)
        slot_row = tl.full([BLOCK_V], 0, tl.int64) + slot                             # [BV]
        b = tl.load(bias_ptr + slot_row * V + vs, mask=inside & (slot_row >= 0), other=0.0)
        acc = acc + w * b
    total = _weight_total(w_ptr, q, K)
    z = tl.load(z_ptr + q * V + vs, mask=inside, other=0.0)
    tl.store(out_ptr + q * V + vs, z + gain * tl.math.div_rn(acc, total), mask=inside)


def bias_add(z: torch.Tensor, nb: Neighbours, support: torch.Tensor, bias: torch.Tensor, gain: float) -> torch.Tensor:
    """Launcher, sparse support. z [Q, V] fp32; support [N, m] int; bias [N, m] fp32 -> new [Q, V]."""
    q, v = z.shape
    k = nb.idx.shape[1]
    out = z.clone()
    m = support.shape[1]
    if q == 0 or k == 0 or m == 0 or support.shape[0] == 0:
        return out
    _sparse_bias_kernel[(q,)](
        z.contiguous(), out, nb.idx.contiguous(), nb.weight.contiguous(), support.contiguous(),
        bias.contiguous(), m, v, float(gain), K=k, BLOCK_K=triton.next_power_of_2(k),
        BLOCK_M=triton.next_power_of_2(m), enable_fp_fusion=False)
    return out


def bias_add_dense(z: torch.Tensor, nb: Neighbours, bias: torch.Tensor, gain: float,
                   block_v: int = 1024) -> torch.Tensor:
    """Launcher, full-vocabulary support. z [Q, V] fp32; bias [N, V] fp32 -> new [Q, V]."""
    q, v = z.shape
    k = nb.idx.shape[1]
    if q == 0 or k == 0 or bias.shape[0] == 0:
        return z.clone()
    out = torch.empty_like(z)
    block_v = min(block_v, triton.next_power_of_2(v))
    _dense_bias_kernel[(q, triton.cdiv(v, block_v))](
        z.contiguous(), out, nb.idx.contiguous(), nb.weight.contiguous(), bias.contiguous(), v,
        K=k, BLOCK_V=block_v, gain=float(gain), enable_fp_fusion=False)
    return out
