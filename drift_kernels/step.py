"""The fused draft step in Triton: retrieval + bias add in two launches per draft token.

    launch 1  `retrieval._tile_topk_kernel`, grid (tiles + copy blocks, Q): each tile program
              scores [BLOCK_N] keys against ĥ_q (GEMV) and writes its k best candidates; each
              copy program copies one block of z into the output.
    launch 2  `_merge_sparse_bias_kernel`, grid (Q,): the k nearest from the candidates, the
              weights, the neighbours' write-out, and the scatter of the k·m support values
              into the output; or `_merge_dense_bias_kernel`, grid (Q, V blocks), for the full
              vocabulary support (each program merges the candidates again, a few hundred
              integers, and writes its block of z + λβ; program (q, 0) writes the neighbours).

The host does no fill, no copy and no synchronisation: four `torch.empty` (output, candidates,
neighbours) and the two launches. Results equal `reference.retrieve` followed by
`reference.bias_add` within the tolerance of the retrieval (docs/drift.md, "Exactness"): the bias
add of the same neighbours is bit-identical.

`warm_up` compiles every kernel the drift method launches at a bank's shapes, so that the JIT
compile stays out of timed regions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drift_kernels import bias as bias_kernels
from drift_kernels import prototype_update, retrieval
from drift_kernels.reference import Neighbours
from drift_kernels.retrieval import _merge, _store_neighbours


@triton.jit(do_not_specialize=["n_cand"])
def _merge_sparse_bias_kernel(cand_ptr, idx_ptr, sim_ptr, w_ptr, z_ptr, out_ptr, sup_ptr, bias_ptr,
                              n_cand, M, V, stride_z, stride_out, two_sigma_sq, gain,
                              K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                              BLOCK_M: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    idx, sim, w = _merge(cand_ptr, q, n_cand, two_sigma_sq, K, BLOCK_C, BLOCK_K)
    _store_neighbours(idx_ptr, sim_ptr, w_ptr, q, idx, sim, w, K, BLOCK_K)
    bias_kernels._support_bias(z_ptr + q * stride_z, out_ptr + q * stride_out, idx, w, sup_ptr, bias_ptr, M, V,
                               gain, K, BLOCK_K, BLOCK_M)


@triton.jit(do_not_specialize=["n_cand"])
def _merge_dense_bias_kernel(cand_ptr, idx_ptr, sim_ptr, w_ptr, z_ptr, out_ptr, bias_ptr,
                             n_cand, V, stride_z, stride_out, two_sigma_sq, gain,
                             K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                             BLOCK_V: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    vblock = tl.program_id(1)
    idx, sim, w = _merge(cand_ptr, q, n_cand, two_sigma_sq, K, BLOCK_C, BLOCK_K)
    if vblock == 0:
        _store_neighbours(idx_ptr, sim_ptr, w_ptr, q, idx, sim, w, K, BLOCK_K)
    bias_kernels._dense_bias(z_ptr + q * stride_z, out_ptr + q * stride_out, idx, w, bias_ptr, V, vblock, gain,
                             K, BLOCK_K, BLOCK_V)


LAUNCHES_PER_STEP = 2   # per draft step (all Q queries of it), sparse or dense support


def draft_step(h: torch.Tensor, z: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor,
               support: torch.Tensor | None, bias: torch.Tensor, k: int, sigma: float,
               gain: float) -> tuple[torch.Tensor, Neighbours]:
    """h [Q, d]; z [Q, V] fp32 (rows unit-stride or not; not modified); keys [N, d] unit rows;
    valid [N] bool; support [N', m] int (N' >= N) or None for the full vocabulary (bias [N', V])
    -> (z + λβ a new [Q, V] fp32 tensor, the neighbours [Q, k]). Two launches."""
    q, v = z.shape
    n = keys.shape[0]
    dev = z.device
    if n == 0 or k == 0 or q == 0 or (support is not None and support.shape[1] == 0):
        nb = retrieval.retrieve(h, keys, valid, k, sigma)
        return z.clone(), nb
    h, keys, z = retrieval.rows_of(h), retrieval.rows_of(keys), retrieval.rows_of(z)
    out = torch.empty((q, v), dtype=torch.float32, device=dev)
    nb = retrieval.new_neighbours(q, k, dev)
    block_k = triton.next_power_of_2(k)
    if support is not None:
        cand = retrieval.launch_tiles(h, keys, valid, k, z, out)          # launch 1 (and out <- z)
        m = support.shape[1]
        _merge_sparse_bias_kernel[(q,)](                                   # launch 2
            cand, nb.idx, nb.sim, nb.weight, z, out, support, bias, cand.shape[1], m, v, z.stride(0),
            out.stride(0), retrieval.two_sigma_sq(sigma), float(gain), K=k, BLOCK_C=retrieval.block_c(n, k),
            BLOCK_K=block_k, BLOCK_M=triton.next_power_of_2(m), enable_fp_fusion=False)
    else:
        cand = retrieval.launch_tiles(h, keys, valid, k)                   # launch 1
        block_v = min(bias_kernels.DENSE_BLOCK_V, triton.next_power_of_2(v))
        _merge_dense_bias_kernel[(q, triton.cdiv(v, block_v))](           # launch 2
            cand, nb.idx, nb.sim, nb.weight, z, out, bias, cand.shape[1], v, z.stride(0), out.stride(0),
            retrieval.two_sigma_sq(sigma), float(gain), K=k, BLOCK_C=retrieval.block_c(n, k),
            BLOCK_K=block_k, BLOCK_V=block_v, enable_fp_fusion=False)
    return out, nb


def warm_up(device: torch.device | str, d: int, m: int, k: int, dtype: torch.dtype, *, bank_size: int = 1024,
            vocab: int = 32000, queries: int = 1, positions: int = 8, adaptive: bool = True) -> int:
    """Compile every Triton kernel the drift method launches on `device` for a bank of
    `bank_size` prototypes of hidden size d in `dtype`, support m (0: full vocabulary), k
    neighbours, `queries` draft rows per step and up to `positions` matched positions per update
    round (with adaptive rates or not, as the bank's rule): the fused draft step at every candidate block the bank reaches while it fills, the
    plain retrieval, and the EMA update for 1..positions positions. Runs the kernels once on
    a scratch bank (the compiled kernels are cached; later launches at these shapes compile
    nothing). Returns the number of launches made. Call it before any timed region."""
    dev = torch.device(device)
    width = m or vocab
    keys = torch.zeros(bank_size, d, dtype=dtype, device=dev)
    keys[:, 0] = 1.0
    valid = torch.ones(bank_size, dtype=torch.bool, device=dev)
    support = torch.arange(bank_size * m, device=dev).remainder(vocab).reshape(bank_size, m) if m else None
    bias = torch.zeros(bank_size, width, dtype=torch.float32, device=dev)
    h = torch.ones(queries, d, dtype=dtype, device=dev)
    z = torch.zeros(queries, vocab, dtype=torch.float32, device=dev)
    launches = 0
    for n in _bank_extents(bank_size, k):
        draft_step(h, z, keys[:n], valid[:n], support, bias, k, 0.5, 1.0)
        retrieval.retrieve(h, keys[:n], valid[:n], k, 0.5)
        launches += 2 * LAUNCHES_PER_STEP
    counts = torch.zeros(bank_size, dtype=torch.int64, device=dev)
    for p in range(1, positions + 1):
        slots = torch.arange(p, device=dev) % bank_size
        prototype_update.update(keys, bias, counts, slots, torch.zeros(p, width, device=dev), h[:1].expand(p, d),
                                0.1, adaptive)
        launches += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return launches


def _bank_extents(bank_size: int, k: int) -> list[int]:
    """One extent (slots scanned) per candidate block the bank passes through as it fills."""
    out, seen = [], set()
    for n in sorted({min(bank_size, 1 << e) for e in range(bank_size.bit_length() + 1)} | {bank_size}):
        if retrieval.block_c(n, k) not in seen:
            seen.add(retrieval.block_c(n, k))
            out.append(n)
    return out
