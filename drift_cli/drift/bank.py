"""One DRIFT bank: the prototype tensors on the draft's device, the books in Rust.

State (N = bank_size, d = draft hidden size, m = support width, V = vocabulary):
    keys    [N, d]  unit rows, the draft's dtype (fp32 on the CPU, fp16/bf16 on a GPU)
    support [N, m]  int64 token ids (unique per row); None when m = 0 (full vocabulary)
    bias    [N, m]  fp32 logit biases on the support ([N, V] when m = 0)
    counts  [N]     int64 update counts n_i
    valid   [N]     bool, the device mirror of the books' validity
Slots, LRU order, tenants and the hit/allocation/eviction counters live in
`drift_cli._bank.Books`; this class batches its calls to one `touch` per iteration plus one
`allocate` per new prototype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import drift_kernels
from drift_cli.drift.config import DriftConfig
from drift_kernels import Neighbours, reference
from drift_kernels import cpu as kernels_cpu
from drift_kernels.ops import resolve

USED_WEIGHT = 1e-3  # a retrieved prototype counts as used when its kernel weight exceeds this


def new_books(capacity: int):
    from drift_cli import _bank  # the Rust extension (maturin); imported when a bank is built
    return _bank.Books(capacity)


@dataclass
class ObserveStats:
    updated: int = 0
    allocated: int = 0
    evicted: int = 0
    refreshed: int = 0     # support entries replaced by the target's top token


class DriftBank:
    def __init__(self, cfg: DriftConfig, dim: int, vocab: int, device: torch.device | str = "cpu",
                 key_dtype: torch.dtype = torch.float32, tenant: str = "default", books=None,
                 backend: str = "auto") -> None:
        self.cfg, self.dim, self.vocab, self.tenant, self.backend = cfg, dim, vocab, tenant, backend
        n, m = cfg.bank_size, cfg.support
        self.books = books if books is not None else new_books(n)
        self.keys = torch.zeros(n, dim, dtype=key_dtype, device=device)
        self.support = torch.zeros(n, m, dtype=torch.int64, device=device) if m else None
        self.bias = torch.zeros(n, m or vocab, dtype=torch.float32, device=device)
        self.counts = torch.zeros(n, dtype=torch.int64, device=device)
        self.valid = torch.zeros(n, dtype=torch.bool, device=device)
        # the CPU path (Rust, on these tensors' memory), which also keeps hi and n_valid
        self.cpu = kernels_cpu.bank(self.keys, self.valid, self.support, self.bias, self.counts, self.books, tenant,
                                    cfg.neighbors, cfg.sigma, cfg.gain, cfg.tau, cfg.eta, cfg.adaptive_rate,
                                    USED_WEIGHT) \
            if resolve(self.keys, backend) == "cpu" and key_dtype == torch.float32 else None
        self.native = self.cpu is not None and self.cpu.owns_books    # the update in Rust too
        self._out = (np.empty((0, 0), dtype=np.float32), None)          # the draft step's output buffer
        # host mirror of `valid` (no device reads); on the CPU path the tensor's own memory
        self._valid_np = self.valid.numpy() if self.cpu is not None else np.zeros(n, dtype=bool)
        self._n_valid = 0         # host-side count, so an empty bank costs no device work
        self._hi = 0              # 1 + the highest valid slot: retrieval scans keys[:hi] only
        self.totals = ObserveStats()
        # (positions, slots) the books handed out in the last `observe`, in order, before a
        # repeated slot is resolved (target-est mirrors allocations on its draft-space shadow)
        self.last_allocation: tuple[list[int], list[int]] = ([], [])

    @property
    def n_valid(self) -> int:
        """Valid prototypes (counted on the host)."""
        return self.cpu.n_valid if self.cpu is not None else self._n_valid

    @property
    def hi(self) -> int:
        """1 + the highest valid slot: retrieval scans keys[:hi] only (fresh books hand out
        slots 0, 1, 2, ...: while the bank fills, the tail is all invalid)."""
        return self.cpu.hi if self.cpu is not None else self._hi

    def set_extent(self, hi: int, n_valid: int) -> None:
        """Sets hi and n_valid after the valid slots changed (an allocation, a snapshot load)."""
        if self.cpu is not None:
            self.cpu.set_extent(hi, n_valid)
        self._hi, self._n_valid = hi, n_valid

    # -- draft step ---------------------------------------------------------------------------

    def retrieve(self, h: torch.Tensor) -> Neighbours:
        """h [Q, d] -> the k nearest prototypes [Q, k]."""
        return drift_kernels.retrieve(h, self.keys[:self.hi], self.valid[:self.hi], self.cfg.neighbors,
                                      self.cfg.sigma, backend=self.backend)

    def adjust(self, z: torch.Tensor, nb: Neighbours) -> torch.Tensor:
        """z [Q, V] sampling-space logits -> z + λβ."""
        return drift_kernels.bias_add(z, nb, self.support, self.bias, self.cfg.gain, backend=self.backend)

    def begin_draft(self) -> None:
        """A new proposal (the CPU path records its retrievals itself)."""
        if self.cpu is not None:
            self.cpu.begin()

    def draft_step(self, h: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, Neighbours | None]:
        """h [Q, d], z [Q, V] fp32 -> (z + λβ, the neighbours; None when the bank is empty).

        The CPU path is one Rust call that records the neighbours itself (returns None for them;
        see `drafted`). Its result lives in a buffer the bank reuses, valid until the next draft
        step (the engine draws the token from it at once): a fresh 16-500 KB array per draft
        token made the allocator consolidate its free lists, measurably, next to the models'."""
        cpu = self.cpu
        if cpu is not None:
            out = self._out
            if out[0].shape != z.shape:
                arr = np.empty(tuple(z.shape), dtype=np.float32)
                out = self._out = (arr, torch.from_numpy(arr))
            return (out[1] if cpu.step(h, z, out[0]) else z), None
        if self._n_valid == 0:
            return z, None
        nb = self.retrieve(h)
        return (self.adjust(z, nb) if self.cfg.gain != 0.0 else z), nb

    def drafted(self, b: int, steps: int) -> Neighbours | None:
        """The CPU path's recorded retrievals of the first `steps` draft steps, [b·steps, k]
        batch-major numpy arrays; None on the other paths (the caller keeps what `draft_step`
        returned)."""
        return Neighbours(*self.cpu.drafted(b, steps)) if self.cpu is not None else None

    # -- update after verification --------------------------------------------------------------

    def observe(self, h: torch.Tensor | np.ndarray, nb: Neighbours, logp: torch.Tensor | np.ndarray,
                logq: torch.Tensor | np.ndarray) -> ObserveStats:
        """One iteration's update, drafted positions in order.

        h [P, d] draft hidden states; nb the draft step's retrieval ([P, k]); logp, logq [P, V]
        the target's and the draft's unbiased log-probabilities at those positions, normalised
        or not (logits / T will do): an update renormalises over the support anyway, so rows are
        normalised over V only where the vocabulary matters (allocation, full support).
        """
        stats = ObserveStats()
        self.last_allocation = ([], [])
        if h.shape[0] == 0:
            return stats
        if self.native:
            arrays = [kernels_cpu.f32_array(t) for t in (h, logp, logq)]
            neighbours = [np.ascontiguousarray(host(t)) for t in (nb.idx, nb.sim, nb.weight)]
            self._tally(stats, *self.cpu.observe(*arrays, h.shape[0], 1.0, *neighbours))
        else:
            h, logp, logq = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in (h, logp, logq))
            self._observe_torch(stats, h, nb, logp, logq)
            for name in vars(stats):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(stats, name))
        return stats

    def observe_drafted(self, hidden: torch.Tensor, target_logits: torch.Tensor, base_logits: torch.Tensor,
                        steps: int, temperature: float) -> None:
        """The CPU path's update (`native` banks) from the iteration's tensors as they are and
        the recorded draft steps: positions (i, t < steps) of hidden [B, γ, d], target_logits
        [B, γ+1, V] and base_logits [B, γ, V], at `temperature` (divided in Rust). No tensor
        operation: each costs microseconds in a loop whose caches the models just flushed."""
        f32 = kernels_cpu.host_f32
        self._tally(None, *self.cpu.observe(f32(hidden), f32(target_logits), f32(base_logits), steps, temperature))

    def _tally(self, stats: ObserveStats | None, updated: int, refreshed: int, evicted: int,
               allocations: list[tuple[int, int]]) -> None:
        """Adds one native update's figures to the totals (and to `stats`)."""
        t = self.totals
        t.updated, t.refreshed, t.evicted = t.updated + updated, t.refreshed + refreshed, t.evicted + evicted
        t.allocated += len(allocations)
        self.last_allocation = tuple(list(x) for x in zip(*allocations)) if allocations else ([], [])
        if stats is not None:
            stats.updated, stats.refreshed, stats.evicted, stats.allocated = \
                updated, refreshed, evicted, len(allocations)

    def _observe_torch(self, stats: ObserveStats, h, nb: Neighbours, logp, logq) -> None:
        """The update in tensor ops (devices, and the reference on the CPU): matched positions in
        occurrence rounds (batched; equal to position order), then the allocations."""
        near, sims, w = (host(t) for t in (nb.idx, nb.sim, nb.weight))  # the one host read
        idx, sim = near[:, 0].tolist(), sims[:, 0].tolist()
        w, near = w.tolist(), near.tolist()
        matched = [p for p in range(len(idx)) if idx[p] >= 0 and sim[p] >= self.cfg.tau]
        fresh = [p for p in range(len(idx)) if p not in set(matched)]
        used = [s for p in range(len(idx)) for s, wt in zip(near[p], w[p]) if s >= 0 and wt > USED_WEIGHT]
        used += [idx[p] for p in matched]
        if used:
            self.books.touch([used[i] for i in last_occurrence(used)])   # one hit per slot per iteration
        for rnd in occurrence_rounds([idx[p] for p in matched]):
            pos = [matched[i] for i in rnd]
            stats.refreshed += self._update(pos, [idx[p] for p in pos], h, logp, logq)
            stats.updated += len(pos)
        if fresh:
            stats.evicted += self._allocate(fresh, h, logp, logq)
            stats.allocated += len(fresh)

    def _update(self, pos: list[int], slots: list[int], h, logp, logq) -> int:
        """EMA update of distinct slots (one occurrence round). Returns the number of refreshes."""
        dev = self.keys.device
        p_idx = torch.tensor(pos, device=dev)
        s_idx = torch.tensor(slots, device=dev)
        lp, lq = logp[p_idx], logq[p_idx]                                      # [R, V]
        refreshed = 0
        if self.support is None:
            residual = (_normalised(lp) - _normalised(lq)).clamp(-reference.RESIDUAL_CLIP, reference.RESIDUAL_CLIP)
        else:
            sup, bias = self.support[s_idx], self.bias[s_idx]                  # [R, m]
            top = lp.argmax(dim=1, keepdim=True)                               # [R, 1] target's top token
            missing = ~(sup == top).any(dim=1, keepdim=True)                   # [R, 1]
            weakest = bias.abs().argmin(dim=1, keepdim=True)                   # [R, 1] smallest |B|
            sup = torch.where(missing, sup.scatter(1, weakest, top), sup)
            bias = torch.where(missing, bias.scatter(1, weakest, torch.zeros_like(top, dtype=bias.dtype)), bias)
            self.support[s_idx], self.bias[s_idx] = sup, bias
            refreshed = int(missing.sum())
            residual = reference.support_residual(lp, lq, sup)
        drift_kernels.update(self.keys, self.bias, self.counts, s_idx, residual, h[p_idx],
                             self.cfg.eta, self.cfg.adaptive_rate, backend=self.backend)
        return refreshed

    def _allocate(self, pos: list[int], h, logp, logq) -> int:
        """New prototypes for positions with no prototype within τ. Returns the evictions."""
        pos, slots, evicted = self._new_slots(pos)
        dev = self.keys.device
        p_idx, s_idx = torch.tensor(pos, device=dev), torch.tensor(slots, device=dev)
        lp, lq = _normalised(logp[p_idx]), _normalised(logq[p_idx])
        self.keys[s_idx] = reference.unit_rows(h[p_idx]).to(self.keys.dtype)
        if self.support is None:
            self.bias[s_idx] = (lp - lq).clamp(-reference.RESIDUAL_CLIP, reference.RESIDUAL_CLIP)
        else:
            sup = torch.maximum(lp, lq).topk(self.cfg.support, dim=1).indices          # [A, m] by max(p, q)
            self.support[s_idx] = sup
            self.bias[s_idx] = reference.support_residual(lp, lq, sup)
        self.counts[s_idx] = 1
        self._mark_valid(slots)
        return evicted

    def _new_slots(self, pos: list[int]) -> tuple[list[int], list[int], int]:
        """One `allocate` per position -> (positions, slots, evictions); if a tiny bank hands out
        a slot twice in one iteration, the last position keeps it."""
        slots, evicted = [], 0
        for _ in pos:
            slot, ev = self.books.allocate(self.tenant)
            slots.append(int(slot))
            evicted += int(ev)
        self.last_allocation = (list(pos), list(slots))
        keep = last_occurrence(slots)
        return [pos[i] for i in keep], [slots[i] for i in keep], evicted

    def _mark_valid(self, slots: list[int]) -> None:
        fresh = [s for s in slots if not self._valid_np[s]]
        if fresh:
            if self.cpu is None:        # on the CPU path the mirror is the tensor's own memory
                self.valid[torch.tensor(fresh, device=self.valid.device)] = True
            self._valid_np[fresh] = True
        self.set_extent(max(self.hi, max(slots) + 1), self.n_valid + len(fresh))

    # -- figures -----------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Exact bytes of the prototype state: N·(d·bytes_key + m·(bytes_id + bytes_val)) + O(N)."""
        tensors = [self.keys, self.bias, self.counts, self.valid] + ([self.support] if self.support is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def stats(self) -> dict:
        out = {k: int(v) for k, v in self.books.stats(self.tenant).items()} if self.n_valid else {}
        out.update({"valid": self.n_valid, "updates": self.totals.updated, "allocations_seen": self.totals.allocated,
                    "support_refreshes": self.totals.refreshed, "memory_bytes": self.memory_bytes()})
        return out


def host(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A host array of neighbour data (the CPU path keeps it in numpy already)."""
    return t if isinstance(t, np.ndarray) else t.cpu().numpy()


def _normalised(logits: torch.Tensor) -> torch.Tensor:
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
