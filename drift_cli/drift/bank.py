"""One DRIFT bank: the prototype tensors on the draft's device, the books in Rust.

State (N = bank_size, d = draft hidden size, m = support width, V = vocabulary):
    keys    [N, d]  unit rows, the draft's dtype (fp32 on the CPU, fp16/bf16 on a GPU)
    support [N, m]  int64 token ids (unique per row); None when m = 0 (full vocabulary)
    bias    [N, m]  fp32 logit biases on the support ([N, V] when m = 0)
    counts  [N]     int64 update counts n_i
    valid   [N]     bool, the device mirror of the books' validity
Slots, LRU order, tenants, the hit/allocation/eviction counters and the bank's extent (hi,
n_valid) live in `drift_cli._bank.Books`.

This class only dispatches: the update is `drift_kernels.reference.observe` (the specification;
on CUDA with the Triton EMA step), or, for fp32 CPU banks with the extension's books, the Rust
`CpuBank` tested equal to it, which also does the draft step in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

import drift_kernels
from drift_cli.drift.config import DriftConfig
from drift_kernels import Neighbours, reference
from drift_kernels import cpu as kernels_cpu
from drift_kernels.ops import resolve
from drift_kernels.reference import Observed

USED_WEIGHT = 1e-3  # a retrieved prototype counts as used when its kernel weight exceeds this


def new_books(capacity: int):
    from drift_cli import _bank  # the Rust extension (maturin); imported when a bank is built
    return _bank.Books(capacity)


@dataclass
class Totals:
    """A bank's update figures over its life."""

    updated: int = 0
    allocated: int = 0
    evicted: int = 0
    refreshed: int = 0     # support entries replaced by the target's top token

    def add(self, done: Observed) -> None:
        self.updated += done.updated
        self.allocated += done.allocated
        self.evicted += done.evicted
        self.refreshed += done.refreshed


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
        self.arrays = reference.BankArrays(self.keys, self.support, self.bias, self.counts, self.valid)
        self.rule = reference.Rule(cfg.tau, cfg.eta, cfg.adaptive_rate, USED_WEIGHT)
        # the CPU path: Rust on these tensors' memory, with the extension's books
        self.cpu = kernels_cpu.bank(self.keys, self.valid, self.support, self.bias, self.counts, self.books, tenant,
                                    cfg.neighbors, cfg.sigma, cfg.gain, cfg.tau, cfg.eta, cfg.adaptive_rate,
                                    USED_WEIGHT) \
            if resolve(self.keys, backend) == "cpu" and key_dtype == torch.float32 \
            and kernels_cpu.owns(self.books) else None
        self.native = self.cpu is not None    # draft step and update in Rust
        self._out = (np.empty((0, 0), dtype=np.float32), None)          # the draft step's output buffer
        self.totals = Totals()

    @property
    def n_valid(self) -> int:
        """Valid prototypes (the books')."""
        return int(self.books.extent()[1])

    @property
    def hi(self) -> int:
        """1 + the highest slot the books handed out: retrieval scans keys[:hi] only (fresh books
        hand out slots 0, 1, 2, ...: while the bank fills, the tail is all invalid)."""
        return int(self.books.extent()[0])

    # -- draft step ---------------------------------------------------------------------------

    def retrieve(self, h: torch.Tensor) -> Neighbours:
        """h [Q, d] -> the k nearest prototypes [Q, k]."""
        hi = self.hi
        return drift_kernels.retrieve(h, self.keys[:hi], self.valid[:hi], self.cfg.neighbors,
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
        if self.n_valid == 0:
            return z, None
        if self.cfg.gain == 0.0:
            return z, self.retrieve(h)
        hi = self.hi                 # one fused op: two Triton launches on CUDA (drift_kernels.step)
        return drift_kernels.draft_step(h, z, self.keys[:hi], self.valid[:hi], self.support, self.bias,
                                        self.cfg.neighbors, self.cfg.sigma, self.cfg.gain, backend=self.backend)

    def drafted(self, b: int, steps: int) -> Neighbours | None:
        """The CPU path's recorded retrievals of the first `steps` draft steps, [b·steps, k]
        batch-major numpy arrays; None on the other paths (the caller keeps what `draft_step`
        returned)."""
        return Neighbours(*self.cpu.drafted(b, steps)) if self.cpu is not None else None

    # -- update after verification --------------------------------------------------------------

    def observe(self, h: torch.Tensor | np.ndarray, nb: Neighbours, logp: torch.Tensor | np.ndarray,
                logq: torch.Tensor | np.ndarray) -> Observed:
        """One iteration's update, drafted positions in order (`reference.observe`).

        h [P, d] draft hidden states; nb the draft step's retrieval ([P, k]); logp, logq [P, V]
        the target's and the draft's unbiased log-probabilities at those positions, normalised
        or not (logits / T will do): an update renormalises over the support anyway, so rows are
        normalised over V only where the vocabulary matters (allocation, full support).
        """
        if h.shape[0] == 0:
            return Observed()
        if self.native:
            arrays = [kernels_cpu.f32_array(t) for t in (h, logp, logq)]
            neighbours = [np.ascontiguousarray(reference._host(t)) for t in (nb.idx, nb.sim, nb.weight)]
            done = _observed(*self.cpu.observe(*arrays, h.shape[0], 1.0, *neighbours))
        else:
            h, logp, logq = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in (h, logp, logq))
            done = reference.observe(self.books, self.tenant, self.arrays, h, logp, logq, nb, self.rule,
                                     ema=partial(drift_kernels.update, backend=self.backend))
        self.totals.add(done)
        return done

    def observe_drafted(self, hidden: torch.Tensor, target_logits: torch.Tensor, base_logits: torch.Tensor,
                        steps: int, temperature: float) -> Observed:
        """The CPU path's update (`native` banks) from the iteration's tensors as they are and
        the recorded draft steps: positions (i, t < steps) of hidden [B, γ, d], target_logits
        [B, γ+1, V] and base_logits [B, γ, V], at `temperature` (divided in Rust). No tensor
        operation: each costs microseconds in a loop whose caches the models just flushed."""
        f32 = kernels_cpu.host_f32
        done = _observed(*self.cpu.observe(f32(hidden), f32(target_logits), f32(base_logits), steps, temperature))
        self.totals.add(done)
        return done

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


def _observed(*fields) -> Observed:
    """The Rust update's tuple (updated, refreshed, evicted, allocations, matched, rates,
    newly_valid) as an `Observed`."""
    return Observed(*fields)
