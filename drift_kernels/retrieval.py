"""Retrieval in Triton: cosine similarity fused with top-k selection, in two launches.

1. `_tile_topk_kernel`, grid (N tiles, Q blocks): each program reads one [BLOCK_N, d] tile of the
   keys once for a whole block of queries (the keys dominate the bytes: 16 MiB at N=4096,
   d=2048 fp16), computes (h·K)/|h| for the tile and keeps the tile's k best per query.
   Only [Q, tiles·k] candidates leave the kernel, never the [Q, N] similarity matrix.
2. `_merge_kernel`, grid (Q,): the k best of the candidates, and the Gaussian weights.
Loop bounds (d) are constexprs: one compilation per hidden size, and the Triton 3.6 interpreter
under numpy >= 2.4 cannot iterate `range` over a runtime scalar.
Ties go to the lower slot id, as in `reference.retrieve`: within a tile `tl.argmax` returns the
first maximum, and candidates are laid out in slot order (tile, then rank).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drift_kernels.reference import NORM_EPS, Neighbours


@triton.jit
def _tile_topk_kernel(h_ptr, keys_ptr, valid_ptr, cand_sim_ptr, cand_idx_ptr,
                      Q, N, stride_h, stride_k, n_cand, D: tl.constexpr,
                      K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    qblk = tl.program_id(1).to(tl.int64)
    qs = qblk * BLOCK_Q + tl.arange(0, BLOCK_Q)                     # [BQ] query rows
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)                    # [BN] slot ids
    dot = tl.zeros([BLOCK_Q, BLOCK_N], dtype=tl.float32)
    hsq = tl.zeros([BLOCK_Q], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        h = tl.load(h_ptr + qs[:, None] * stride_h + cols[None, :],
                    mask=(qs[:, None] < Q) & (cols[None, :] < D), other=0.0).to(tl.float32)
        kt = tl.load(keys_ptr + rows[None, :] * stride_k + cols[:, None],
                     mask=(rows[None, :] < N) & (cols[:, None] < D), other=0.0).to(tl.float32)
        dot += tl.dot(h, kt, input_precision="ieee")                 # [BQ, BD] @ [BD, BN]
        hsq += tl.sum(h * h, axis=1)
    norm = tl.maximum(tl.sqrt(hsq), NORM_EPS)
    live = tl.load(valid_ptr + rows, mask=rows < N, other=0) != 0
    sim = tl.where(live[None, :], dot / norm[:, None], float("-inf"))
    lanes = tl.arange(0, BLOCK_N)
    for j in tl.static_range(K):
        best = tl.max(sim, axis=1)                                    # [BQ]
        at = tl.argmax(sim, axis=1)                                   # first maximum
        slot = tl.where(best > float("-inf"), tile * BLOCK_N + at, -1)
        out = qs * n_cand + tile * K + j
        tl.store(cand_sim_ptr + out, best, mask=qs < Q)
        tl.store(cand_idx_ptr + out, slot, mask=qs < Q)
        sim = tl.where(lanes[None, :] == at[:, None], float("-inf"), sim)


@triton.jit
def _merge_kernel(cand_sim_ptr, cand_idx_ptr, idx_ptr, sim_ptr, w_ptr, n_cand, inv_two_sigma_sq,
                  K: tl.constexpr, BLOCK_C: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    sim = tl.load(cand_sim_ptr + q * n_cand + offs, mask=offs < n_cand, other=float("-inf"))
    cand = tl.load(cand_idx_ptr + q * n_cand + offs, mask=offs < n_cand, other=-1)
    for j in tl.static_range(K):
        best = tl.max(sim, axis=0)
        at = tl.argmax(sim, axis=0)
        found = best > float("-inf")
        slot = tl.sum(tl.where(offs == at, cand, 0), axis=0)
        dist = 1.0 - best
        w = tl.where(found, tl.exp(-(dist * dist) * inv_two_sigma_sq), 0.0)
        tl.store(idx_ptr + q * K + j, tl.where(found, slot, -1))
        tl.store(sim_ptr + q * K + j, best)
        tl.store(w_ptr + q * K + j, w)
        sim = tl.where(offs == at, float("-inf"), sim)


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float,
             block_n: int = 64) -> Neighbours:
    """Launcher. h [Q, d]; keys [N, d]; valid [N] bool -> Neighbours ([Q, k] each)."""
    q, d = h.shape
    n = keys.shape[0]
    dev = h.device
    idx = torch.full((q, k), -1, dtype=torch.int64, device=dev)
    sim = torch.full((q, k), float("-inf"), dtype=torch.float32, device=dev)
    w = torch.zeros((q, k), dtype=torch.float32, device=dev)
    if n == 0 or k == 0 or q == 0:
        return Neighbours(idx, sim, w)
    h = h.contiguous()
    keys = keys.contiguous()
    block_n = max(16, min(block_n, triton.next_power_of_2(n)))
    block_d = max(16, min(128, triton.next_power_of_2(d)))
    block_q = 16                                                       # tl.dot's minimum
    tiles = triton.cdiv(n, block_n)
    n_cand = tiles * k
    cand_sim = torch.empty((q, n_cand), dtype=torch.float32, device=dev)
    cand_idx = torch.empty((q, n_cand), dtype=torch.int64, device=dev)
    _tile_topk_kernel[(tiles, triton.cdiv(q, block_q))](
        h, keys, valid.to(torch.int8), cand_sim, cand_idx, q, n, h.stride(0), keys.stride(0),
        n_cand, D=d, K=k, BLOCK_Q=block_q, BLOCK_N=block_n, BLOCK_D=block_d)
    _merge_kernel[(q,)](cand_sim, cand_idx, idx, sim, w, n_cand, 1.0 / (2.0 * sigma * sigma),
                        K=k, BLOCK_C=triton.next_power_of_2(n_cand))
    return Neighbours(idx, sim, w)
