"""Pure-PyTorch reference for the DRIFT ops: the ground truth and the CPU path.

Shapes: Q query positions (B·γ per iteration), N bank slots, d hidden size, m support width,
V vocabulary, k neighbours. Keys are unit rows in fp32, fp16 or bf16; every computation runs in
fp32. The Triton kernels (`retrieval.py`, `bias.py`, `prototype_update.py`) are tested against these
functions; the bias add is bit-exact, so its summation order here is part of the contract:
for each output token, sum w_j * B_j over the neighbours j = 0..k-1 in order, starting from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORM_EPS = 1e-12      # |h| floor before dividing (a zero hidden state gives zero similarities)
RESIDUAL_CLIP = 10.0  # residuals are clipped to ±10 (DESIGN.md)


@dataclass
class Neighbours:
    """The k nearest prototypes of each query, most similar first. (The CPU path of a bank
    keeps them as numpy arrays of the same shapes and dtypes: they only go back into the bank.)"""

    idx: torch.Tensor     # [Q, k] int64 slot ids; -1 where fewer than k slots are valid
    sim: torch.Tensor     # [Q, k] fp32 cosine similarity; -inf where idx == -1
    weight: torch.Tensor  # [Q, k] fp32 Gaussian kernel weight; 0 where idx == -1


def unit_rows(h: torch.Tensor) -> torch.Tensor:
    """h [Q, d] any float dtype -> ĥ = h / max(|h|, eps) in fp32."""
    h = h.float()
    return h / h.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)


def kernel_weight(sim: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian kernel over cosine distance: exp(-(1 - s)^2 / (2σ^2)); 0 where s = -inf."""
    w = torch.exp(-((1.0 - sim) ** 2) / (2.0 * sigma * sigma))
    return torch.where(torch.isfinite(sim), w, torch.zeros_like(w))


def retrieve(h: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int, sigma: float) -> Neighbours:
    """k nearest valid prototypes by cosine similarity, most similar first.

    h [Q, d]; keys [N, d] unit rows; valid [N] bool. Ties go to the lower slot id, which the
    Triton kernel reproduces: `topk` is used (cheap), and only when its result holds a tie does
    a stable sort decide.
    """
    q, n = h.shape[0], keys.shape[0]
    if n == 0 or k == 0:
        empty = torch.empty((q, k), device=h.device)
        return Neighbours(empty.long().fill_(-1), empty.fill_(float("-inf")), torch.zeros_like(empty))
    sim = unit_rows(h) @ keys.float().T                                   # [Q, N]
    sim = sim.masked_fill(~valid.bool()[None, :], float("-inf"))
    kk = min(k, n)
    top, order = sim.topk(min(kk + 1, n), dim=-1)                         # one extra to see boundary ties
    if bool((top[:, 1:] == top[:, :-1]).any()):
        top, order = torch.sort(sim, dim=-1, descending=True, stable=True)
    top, order = top[:, :kk], order[:, :kk]
    if kk < k:                                                            # N < k: pad
        top = torch.nn.functional.pad(top, (0, k - kk), value=float("-inf"))
        order = torch.nn.functional.pad(order, (0, k - kk), value=-1)
    idx = torch.where(torch.isfinite(top), order, torch.full_like(order, -1))
    return Neighbours(idx, top, kernel_weight(top, sigma))


def weight_total(weight: torch.Tensor) -> torch.Tensor:
    """[Q, k] -> max(1, Σ_j w_j) [Q, 1], summed j = 0..k-1 in order (the kernel's order)."""
    total = torch.zeros_like(weight[:, 0])
    for j in range(weight.shape[1]):
        total = total + weight[:, j]
    return total.clamp_min(1.0)[:, None]


def bias_add(z: torch.Tensor, nb: Neighbours, support: torch.Tensor, bias: torch.Tensor, gain: float,
             per_neighbour: bool | None = None) -> torch.Tensor:
    """z' = z + λ · Σ_j w_j scatter_V(S_j, B_j) / max(1, Σ_j w_j).

    z [Q, V] fp32 sampling-space logits (not modified); support [N, m] int token ids (unique per
    row); bias [N, m] fp32. Returns a new [Q, V] fp32 tensor. Each token's sum runs over
    j = 0..k-1 in order from 0: on the CPU one scatter_add over the flattened (j, t) positions
    (the CPU kernel walks them in order); on CUDA one scatter_add per j (no colliding atomics).
    `per_neighbour` forces either form (default: per j on CUDA only).
    """
    q, k = nb.idx.shape
    if k == 0 or support.shape[0] == 0 or support.shape[1] == 0:
        return z.clone()
    rows = nb.idx.clamp_min(0)                                            # [Q, k]
    live = (nb.idx >= 0)[:, :, None]
    contrib = torch.where(live, nb.weight[:, :, None] * bias[rows], 0.0)  # [Q, k, m]
    ids = support[rows].long()                                            # [Q, k, m]
    acc = torch.zeros_like(z)                                             # [Q, V]
    if z.is_cuda if per_neighbour is None else per_neighbour:
        for j in range(k):
            acc.scatter_add_(1, ids[:, j], contrib[:, j])
    else:
        acc.scatter_add_(1, ids.reshape(q, -1), contrib.reshape(q, -1))
    return z + gain * (acc / weight_total(nb.weight))


def bias_add_dense(z: torch.Tensor, nb: Neighbours, bias: torch.Tensor, gain: float) -> torch.Tensor:
    """The full-vocabulary support (m = 0): bias [N, V] fp32. Same order and rounding as bias_add."""
    acc = torch.zeros_like(z)
    for j in range(nb.idx.shape[1]):
        slot = nb.idx[:, j]
        contrib = nb.weight[:, j, None] * bias[slot.clamp_min(0)]
        acc = acc + torch.where((slot >= 0)[:, None], contrib, torch.zeros_like(contrib))
    return z + gain * (acc / weight_total(nb.weight))


def support_residual(logp: torch.Tensor, logq: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """r = log p_S - log q_S, both renormalised over the support S, clipped to ±10.

    logp, logq [P, V] log-probabilities (target, draft; unbiased); support [P, m] token ids.
    Returns [P, m] fp32.
    """
    ids = support.long()
    lp = logp.gather(1, ids)
    lq = logq.gather(1, ids)
    lp = lp - torch.logsumexp(lp, dim=1, keepdim=True)
    lq = lq - torch.logsumexp(lq, dim=1, keepdim=True)
    return (lp - lq).clamp(-RESIDUAL_CLIP, RESIDUAL_CLIP)


def update_rate(count: int | torch.Tensor, eta: float, adaptive: bool):
    """η_i = max(η, 1/(n_i + 1)) with adaptive rates, else η."""
    return max(eta, 1.0 / (float(count) + 1.0)) if adaptive else eta


def update(keys: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor, slots: torch.Tensor,
           residual: torch.Tensor, h: torch.Tensor, eta: float, adaptive: bool) -> None:
    """EMA step for matched prototypes, positions in order (a slot may be hit twice). In place.

    keys [N, d] (fp32/fp16/bf16); bias [N, m] fp32; counts [N] int; slots [P] int64;
    residual [P, m] fp32 on each slot's own support; h [P, d] raw draft hidden states.
        B_i <- (1 - η_i) B_i + η_i r;  K_i <- normalise((1 - η_i) K_i + η_i ĥ);  n_i += 1
    """
    hn = unit_rows(h)
    for p, slot in enumerate(slots.tolist()):
        rate = update_rate(int(counts[slot]), eta, adaptive)
        bias[slot] = (1.0 - rate) * bias[slot] + rate * residual[p]
        key = (1.0 - rate) * keys[slot].float() + rate * hn[p]
        keys[slot] = (key / key.norm().clamp_min(NORM_EPS)).to(keys.dtype)
        counts[slot] += 1
