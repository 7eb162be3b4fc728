"""Retrieval in Triton: cosine similarity fused with top-k selection, in two launches.

1. `_tile_topk_kernel`, grid (tiles + copy blocks, Q): program (t, q) with t < tiles reads one
   [BLOCK_N, d] tile of the keys (the keys are the bytes that matter: 16 MiB at N=4096,
   d=2048 fp16) and computes (h_q·K)/|h_q| for its rows as a GEMV (elementwise products summed
   over d, |h| alongside, no padding of the query to a matrix tile), then keeps the tile's k best. Only [Q, tiles·k]
   candidates leave the kernel, never the [Q, N] similarity matrix. The programs t >= tiles copy
   one [BLOCK_V] block of the logits z into the output (the fused draft step's bias add,
   `drift_kernels.step`, writes only the support positions afterwards); plain retrieval has none.
2. `_merge_kernel`, grid (Q,): the k best of the candidates, and the Gaussian weights (the fused
   draft step merges in its bias-add kernel instead).

A candidate is one int64 key, `_pack(sim, slot)`: the similarity's bits mapped to an ordered
int32 in the high half, 0x7FFFFFFF - slot in the low half, so one integer max picks the highest
similarity and, among equal ones, the lower slot id (the reference's tie rule). The k best are k
rounds of "the largest key below the previous one": no removal, no gathers.
Loop bounds (d) are constexprs and the varying sizes (N, tiles, candidates) are never
specialised: one compilation per hidden size and candidate block; the Triton 3.6 interpreter
under numpy >= 2.4 cannot iterate `range` over a runtime scalar, so no loop bound is one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from drift_kernels.reference import NORM_EPS, Neighbours

# Tile shape, measured on an H200 (docs/drift.md, "Kernels"): 16 rows x 256 entries, 4 warps; 8 to
# 32 rows and 512 entries are within 10%, 64 rows is slower.
BLOCK_N = 16          # key rows per program: N=4096 gives 256 programs, about two per SM
MAX_BLOCK_D = 256     # hidden entries per step of the (unrolled) loop over d
COPY_BLOCK_V = 4096   # logits copied per copy program
MIN_BLOCK_C = 256     # smallest candidate block of the merge (one compilation up to tiles·k = 256)
NUM_WARPS = 4


@triton.jit
def _floor_key():
    """The key below every candidate: similarity -inf, slot 0x7FFFFFFF (decodes as not found)."""
    return _pack(tl.full([], float("-inf"), tl.float32), tl.full([], 0x7FFFFFFF, tl.int64))


@triton.jit
def _pack(sim, slot):
    """sim fp32 [X], slot int64 [X] (< 2^31) -> int64 keys ordered by sim, then by lower slot."""
    sim = tl.where(sim == 0.0, 0.0, sim)                    # -0.0 ties with 0.0, as in the reference
    bits = sim.to(tl.int32, bitcast=True)
    order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (order.to(tl.int64) << 32) + (0x7FFFFFFF - slot)


@triton.jit
def _unpack(key):
    """int64 keys [X] -> (sim fp32 [X], slot int64 [X])."""
    order = (key >> 32).to(tl.int32)
    bits = tl.where(order >= 0, order, order ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _top_k(keys, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """keys int64 [X] (distinct, or the floor key) -> [BLOCK_K] the K largest, descending, the
    floor key after them (and where fewer than K keys are above it)."""
    js = tl.arange(0, BLOCK_K)
    floor = _floor_key()
    top = tl.zeros([BLOCK_K], dtype=tl.int64) + floor
    prev = tl.full([], 9223372036854775807, tl.int64)
    for j in tl.static_range(K):
        best = tl.max(tl.where(keys < prev, keys, floor), axis=0)
        top = tl.where(js == j, best, top)
        prev = best
    return top


@triton.jit
def _scores(h_row, keys_ptr, rows, N, stride_k, NORM_EPS: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """(h·K_r) / |h| for rows [BN]: one pass over d, |h| alongside, one division at the end."""
    hsq = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        h = tl.load(h_row + cols, mask=cols < D, other=0.0).to(tl.float32)
        kt = tl.load(keys_ptr + rows[:, None] * stride_k + cols[None, :],
                     mask=(rows[:, None] < N) & (cols[None, :] < D), other=0.0)   # [BN, BD]
        hsq += h * h
        acc += kt.to(tl.float32) * h[None, :]
    norm = tl.maximum(tl.sqrt_rn(tl.sum(hsq, axis=0)), NORM_EPS)
    return tl.math.div_rn(tl.sum(acc, axis=1), norm)


@triton.jit(do_not_specialize=["N", "n_tiles", "n_cand"])
def _tile_topk_kernel(h_ptr, keys_ptr, valid_ptr, cand_ptr, z_ptr, out_ptr,
                      N, V, n_tiles, n_cand, stride_h, stride_k, stride_z, stride_out,
                      NORM_EPS: tl.constexpr, D: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    q = tl.program_id(1).to(tl.int64)
    if pid < n_tiles:
        tile = pid.to(tl.int64)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)                            # [BN] slot ids
        dot = _scores(h_ptr + q * stride_h, keys_ptr, rows, N, stride_k, NORM_EPS, D, BLOCK_N, BLOCK_D)
        live = tl.load(valid_ptr + rows, mask=rows < N, other=0) != 0
        sim = tl.where(live, dot, float("-inf"))                                  # [BN]
        top = _top_k(_pack(sim, rows), K, BLOCK_K)                                # [BK]
        js = tl.arange(0, BLOCK_K)
        tl.store(cand_ptr + q * n_cand + tile * K + js, top, mask=js < K)
    else:
        vs = (pid - n_tiles).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
        z = tl.load(z_ptr + q * stride_z + vs, mask=vs < V)
        tl.store(out_ptr + q * stride_out + vs, z, mask=vs < V)


@triton.jit
def _merge(cand_ptr, q, n_cand, two_sigma_sq, K: tl.constexpr, BLOCK_C: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """Query q's k nearest from its candidates -> (idx int64 [BK], sim [BK], weight [BK])."""
    offs = tl.arange(0, BLOCK_C)
    cand = tl.load(cand_ptr + q * n_cand + offs, mask=offs < n_cand, other=_floor_key())
    sim, slot = _unpack(_top_k(cand, K, BLOCK_K))
    found = sim > float("-inf")
    dist = 1.0 - sim
    w = tl.exp(tl.math.div_rn(-(dist * dist), two_sigma_sq))                       # exp(-(1-s)²/(2σ²))
    return tl.where(found, slot, -1), sim, tl.where(found, w, 0.0)


@triton.jit
def _store_neighbours(idx_ptr, sim_ptr, w_ptr, q, idx, sim, w, K: tl.constexpr, BLOCK_K: tl.constexpr):
    js = tl.arange(0, BLOCK_K)
    tl.store(idx_ptr + q * K + js, idx, mask=js < K)
    tl.store(sim_ptr + q * K + js, sim, mask=js < K)
    tl.store(w_ptr + q * K + js, w, mask=js < K)


@triton.jit(do_not_specialize=["n_cand"])
def _merge_kernel(cand_ptr, idx_ptr, sim_ptr, w_ptr, n_cand, two_sigma_sq,
                  K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    idx, sim, w = _merge(cand_ptr, q, n_cand, two_sigma_sq, K, BLOCK_C, BLOCK_K)
    _store_neighbours(idx_ptr, sim_ptr, w_ptr, q, idx, sim, w, K, BLOCK_K)


# --- launchers ----------------------------------------------------------------------------------

def tiles(n: int) -> int:
    return triton.cdiv(n, BLOCK_N)


def block_c(n: int, k: int) -> int:
    """The merge's candidate block for a bank of n slots (a power of two, at least MIN_BLOCK_C)."""
    return max(MIN_BLOCK_C, triton.next_power_of_2(tiles(n) * k))


@lru_cache(maxsize=64)
def two_sigma_sq(sigma: float) -> float:
    """2σ² rounded to fp32 once, as torch divides an fp32 tensor by the Python scalar."""
    return float(np.float32(2.0 * sigma * sigma))


def rows_of(t: torch.Tensor) -> torch.Tensor:
    """A [R, X] tensor whose rows are unit-stride (a view when they already are)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def launch_tiles(h, keys, valid, k: int, z=None, out=None) -> torch.Tensor:
    """The first launch: candidates [Q, tiles·k] int64 keys; with z and out, also out <- z."""
    q, d = h.shape
    n = keys.shape[0]
    n_tiles = tiles(n)
    n_cand = n_tiles * k
    cand = torch.empty((q, n_cand), dtype=torch.int64, device=h.device)
    if z is None:                                          # no copy programs: z, out unused, fp32 so
        z = out = cand.view(torch.float32)                 # that both uses share one compilation
        v, n_copy, stride_z, stride_out = 0, 0, 0, 0
    else:
        v = z.shape[1]
        n_copy, stride_z, stride_out = triton.cdiv(v, COPY_BLOCK_V), z.stride(0), out.stride(0)
    _tile_topk_kernel[(n_tiles + n_copy, q)](
        h, keys, valid, cand, z, out, n, v, n_tiles, n_cand, h.stride(0), keys.stride(0), stride_z, stride_out,
        NORM_EPS=NORM_EPS, D=d, K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_N=BLOCK_N,
        BLOCK_D=min(MAX_BLOCK_D, triton.next_power_of_2(d)), BLOCK_V=COPY_BLOCK_V,
        num_warps=NUM_WARPS)
    return cand


def empty_neighbours(q: int, k: int, device) -> Neighbours:
    idx = torch.full((q, k), -1, dtype=torch.int64, device=device)
    return Neighbours(idx, torch.full((q, k), float("-inf"), device=device), torch.zeros((q, k), device=device))


def new_neighbours(q: int, k: int, device) -> Neighbours:
    """Uninitialised [Q, k] outputs (the kernels write every entry)."""
    return Neighbours(torch.empty((q, k), dtype=torch.int64, device=device),
                      torch.empty((q, k), dtype=torch.float32, device=device),
                      torch.empty((q, k), dtype=torch.float32, device=device))


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float) -> Neighbours:
    """Launcher, two launches. h [Q, d]; keys [N, d]; valid [N] bool -> Neighbours ([Q, k] each)."""
    q = h.shape[0]
    n = keys.shape[0]
    if n == 0 or k == 0 or q == 0:
        return empty_neighbours(q, k, h.device)
    h, keys = rows_of(h), rows_of(keys)
    cand = launch_tiles(h, keys, valid, k)
    nb = new_neighbours(q, k, h.device)
    _merge_kernel[(q,)](cand, nb.idx, nb.sim, nb.weight, cand.shape[1], two_sigma_sq(sigma),
                        K=k, BLOCK_C=block_c(n, k), BLOCK_K=triton.next_power_of_2(k),
                        enable_fp_fusion=False)
    return nb
