"""Pure-PyTorch reference for the DRIFT ops and the whole update: the specification.

Shapes: Q query positions (B·γ per iteration), N bank slots, d hidden size, m support width,
V vocabulary, k neighbours. Keys are unit rows in fp32, fp16 or bf16; every computation runs in
fp32. The Triton kernels (`retrieval.py`, `bias.py`, `prototype_update.py`, the GPU path) and the
Rust ones (`drift_kernels.cpu`, the CPU path) are tested against these functions; the bias add
is bit-exact, so its summation order here is part of the contract: for each output token, sum
w_j * B_j over the neighbours j = 0..k-1 in order, starting from 0. `observe` is one
iteration's whole update (books included): the reference on devices (with the Triton EMA step
on CUDA), and what the Rust `CpuBank.observe` is tested equal to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

NORM_EPS = 1e-12      # |h| floor before dividing (a zero hidden state gives zero similarities)
RESIDUAL_CLIP = 10.0  # residuals are clipped to ±10 (the specification of the update)


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
    # an elementwise product summed per row, not a matmul: a blocked matmul can round identical
    # key rows differently by their position, and then equal keys would not tie
    sim = (unit_rows(h)[:, None, :] * keys.float()[None, :, :]).sum(-1)   # [Q, N]
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


# --- the whole update: the specification of one iteration's DRIFT update ---------------------

@dataclass
class BankArrays:
    """A bank's prototype tensors (one device; written in place by `observe`)."""

    keys: torch.Tensor               # [N, d] unit rows (fp32, fp16 or bf16)
    support: torch.Tensor | None     # [N, m] int64 token ids, unique per row; None: full vocabulary
    bias: torch.Tensor               # [N, m] fp32 ([N, V] for the full vocabulary)
    counts: torch.Tensor             # [N] int64 update counts n_i
    valid: torch.Tensor              # [N] bool, the device mirror of the books' validity


@dataclass(frozen=True)
class Rule:
    """The knobs of the update: match threshold τ, EMA rate η, adaptive rates, and the kernel
    weight above which a retrieved prototype counts as used (for the books' LRU order)."""

    tau: float
    eta: float
    adaptive: bool
    used_weight: float


@dataclass
class Observed:
    """What one iteration's update did."""

    updated: int = 0                  # matched positions (EMA updates)
    refreshed: int = 0                # support entries replaced by the target's top token
    evicted: int = 0                  # allocations that evicted a prototype
    # (position, slot) of every allocation the books made, in order (a tiny bank may hand a slot
    # out twice in one iteration; then the last position keeps it)
    allocations: list[tuple[int, int]] = field(default_factory=list)
    # (position, slot) of every matched position, in order, and the EMA rate η_i each update used
    matched: list[tuple[int, int]] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    newly_valid: list[int] = field(default_factory=list)    # slots that became valid

    @property
    def allocated(self) -> int:
        return len(self.allocations)


def matched_positions(nb: Neighbours, tau: float) -> list[tuple[int, int]]:
    """The match rule: position p updates its nearest prototype when one exists with similarity
    >= τ. nb [P, k] (tensors or host arrays) -> [(p, slot)] in position order."""
    idx, sim = nb.idx[:, 0].tolist(), nb.sim[:, 0].tolist()
    return [(p, idx[p]) for p in range(len(idx)) if idx[p] >= 0 and sim[p] >= tau]


def observe(books, tenant: str, bank: BankArrays, h: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor,
            nb: Neighbours, rule: Rule, ema: Callable = update) -> Observed:
    """One iteration's DRIFT update, drafted positions in order, books included (in place).

    h [P, d] draft hidden states; logp, logq [P, V] the target's and the draft's unbiased
    log-probabilities (unnormalised will do: rows are normalised where the vocabulary matters);
    nb the draft step's retrievals [P, k]; books: `touch(slots)`, `allocate(tenant) -> (slot,
    evicted)` (the extension's `Books`). Steps:
    1. position p is matched when its nearest prototype exists with similarity >= τ;
    2. one `touch` of the slots retrieved with weight > `used_weight` and the matched slots,
       each once, ordered by its last use;
    3. the matched updates in position order: support refresh (the target's top token replaces
       the entry with the smallest |B| when missing), the residual on the support, then the EMA
       step `ema` (this module's `update`, or a kernel tested equal to it), applied in
       occurrence rounds (round r holds each slot's r-th occurrence: equal to position order);
    4. one allocation per other position, in order; when a slot repeats, its last position
       writes it: K = ĥ, S = the top-m tokens by max(p, q), B = the residual on S, n = 1.
    The Rust `CpuBank.observe` (`drift_bank_core::kernels::observe`) is tested equal to this.
    """
    out = Observed()
    near, w = _host(nb.idx), _host(nb.weight)           # the one host read of the neighbours
    matched = matched_positions(Neighbours(near, _host(nb.sim), w), rule.tau)
    is_matched = {p for p, _ in matched}
    near, w = near.tolist(), w.tolist()
    used = [s for p in range(len(near)) for s, wt in zip(near[p], w[p]) if s >= 0 and wt > rule.used_weight]
    used += [slot for _, slot in matched]
    if used:
        books.touch([used[i] for i in last_occurrence(used)])          # one hit per slot per iteration
    if matched:
        before = bank.counts[torch.tensor([s for _, s in matched], device=bank.counts.device)].tolist()
        seen: dict[int, int] = {}
        for (_, slot), n0 in zip(matched, before, strict=True):        # n_i before each update
            out.rates.append(update_rate(n0 + seen.get(slot, 0), rule.eta, rule.adaptive))
            seen[slot] = seen.get(slot, 0) + 1
    for rnd in occurrence_rounds([slot for _, slot in matched]):
        pairs = [matched[i] for i in rnd]
        out.refreshed += _update_round(bank, pairs, h, logp, logq, rule, ema)
    out.updated, out.matched = len(matched), matched
    fresh = [p for p in range(len(near)) if p not in is_matched]
    handed = [books.allocate(tenant) for _ in fresh]
    out.allocations = [(p, int(slot)) for p, (slot, _) in zip(fresh, handed, strict=True)]
    out.evicted = sum(bool(ev) for _, ev in handed)
    if fresh:
        new = {int(slot) for slot, ev in handed if not ev}              # free slots: not valid before
        keep = [out.allocations[i] for i in last_occurrence([s for _, s in out.allocations])]
        _allocate(bank, keep, h, logp, logq)
        out.newly_valid = [s for _, s in keep if s in new]
        if out.newly_valid:
            bank.valid[torch.tensor(out.newly_valid, device=bank.valid.device)] = True
    return out


def _update_round(bank: BankArrays, pairs: list[tuple[int, int]], h, logp, logq, rule: Rule, ema) -> int:
    """The matched update of distinct slots (one occurrence round). Returns the support refreshes."""
    dev = bank.keys.device
    p_idx = torch.tensor([p for p, _ in pairs], device=dev)
    s_idx = torch.tensor([s for _, s in pairs], device=dev)
    lp, lq = logp[p_idx], logq[p_idx]                                      # [R, V]
    refreshed = 0
    if bank.support is None:
        residual = (normalised(lp) - normalised(lq)).clamp(-RESIDUAL_CLIP, RESIDUAL_CLIP)
    else:
        sup, bias = bank.support[s_idx], bank.bias[s_idx]                  # [R, m]
        top = lp.argmax(dim=1, keepdim=True)                               # [R, 1] target's top token
        missing = ~(sup == top).any(dim=1, keepdim=True)                   # [R, 1]
        weakest = bias.abs().argmin(dim=1, keepdim=True)                   # [R, 1] smallest |B|
        sup = torch.where(missing, sup.scatter(1, weakest, top), sup)
        bias = torch.where(missing, bias.scatter(1, weakest, torch.zeros_like(top, dtype=bias.dtype)), bias)
        bank.support[s_idx], bank.bias[s_idx] = sup, bias
        refreshed = int(missing.sum())
        residual = support_residual(lp, lq, sup)
    ema(bank.keys, bank.bias, bank.counts, s_idx, residual, h[p_idx], rule.eta, rule.adaptive)
    return refreshed


def _allocate(bank: BankArrays, pairs: list[tuple[int, int]], h, logp, logq) -> None:
    """New prototypes at distinct slots: K = ĥ, S = top-m of max(p, q), B = the residual, n = 1."""
    dev = bank.keys.device
    p_idx = torch.tensor([p for p, _ in pairs], device=dev)
    s_idx = torch.tensor([s for _, s in pairs], device=dev)
    lp, lq = normalised(logp[p_idx]), normalised(logq[p_idx])
    bank.keys[s_idx] = unit_rows(h[p_idx]).to(bank.keys.dtype)
    if bank.support is None:
        bank.bias[s_idx] = (lp - lq).clamp(-RESIDUAL_CLIP, RESIDUAL_CLIP)
    else:
        sup = torch.maximum(lp, lq).topk(bank.support.shape[1], dim=1).indices    # [A, m] by max(p, q)
        bank.support[s_idx] = sup
        bank.bias[s_idx] = support_residual(lp, lq, sup)
    bank.counts[s_idx] = 1


def _host(x):
    """Neighbour data on the host (numpy arrays stay as they are)."""
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


def normalised(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] unnormalised log-probabilities -> log-probabilities."""
    return logits - torch.logsumexp(logits, dim=1, keepdim=True)


def occurrence_rounds(slots: list[int]) -> list[list[int]]:
    """Split positions into rounds of distinct slots: round r holds each slot's r-th occurrence.

    Applying the rounds in order equals applying the positions in order, since positions on
    different slots commute. Returns lists of indices into `slots`.
    """
    seen: dict[int, int] = {}
    rounds: list[list[int]] = []
    for i, s in enumerate(slots):
        r = seen.get(s, 0)
        seen[s] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    return rounds


def last_occurrence(items: list[int]) -> list[int]:
    """Indices of the last occurrence of each distinct item, in order."""
    last = {x: i for i, x in enumerate(items)}
    return sorted(last.values())
