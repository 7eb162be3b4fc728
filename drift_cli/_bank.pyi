"""Type stub for `drift_cli._bank`, the Rust (PyO3) books of a DRIFT bank.

The books track which of the bank's N slots hold a prototype, which tenant owns each, the
least-recently-used order and hit / allocation / eviction counters. The arrays themselves
(keys, support ids, bias values, counts) live in torch tensors on the device; the books only
say which slot to write. allocate, release, owner, is_valid and stats are O(1), touch is
O(batch); the listing queries (recency, valid_slots) are O(N), meant for reports, tests and
snapshots rather than the decoding loop.

Tenants: with `quotas=None` tenants are created on first use and share the whole capacity
(one global LRU). A tenant with a quota reserves that many slots, never holds more, and evicts
only its own slots. Tenants without a quota share the rest (the pool, capacity - sum of quotas)
and evict the pool's least recently used slot. Free slots are a stack: a fresh bank hands out
0, 1, 2, ...; a released slot is reused first.
"""

import os
from collections.abc import Sequence

import numpy
import numpy.typing as npt
import torch

# float32 rows read in place: a numpy array or a CPU torch tensor (rows contiguous, any row stride)
_Rows = npt.NDArray[numpy.float32] | torch.Tensor

SNAPSHOT_FORMAT_VERSION: int

class BankError(Exception):
    """Base of every error the bank raises."""

class TenantError(BankError):
    """A tenant added twice, or an empty tenant name."""

class UnknownTenant(TenantError):
    """A tenant the books do not know (books built with quotas never create tenants)."""

class SlotError(BankError):
    """A slot index out of range, or a free slot where a used one is needed (touch, release)."""

class QuotaError(BankError):
    """Quotas exceeding the capacity, allocating with a zero quota or pool, a bad capacity."""

class SnapshotError(BankError):
    """Base of snapshot problems; raised itself by `save_snapshot` for unsavable input."""

class SnapshotCorrupt(SnapshotError):
    """Truncated, failing its checksum, or disagreeing with its own metadata."""

class SnapshotVersionError(SnapshotError):
    """Written in a format version this build does not read."""

class SnapshotDraftMismatch(SnapshotError):
    """Made for a draft model other than `expect_draft`."""

class Books:
    def __init__(self, capacity: int, quotas: dict[str, int | None] | None = None) -> None:
        """`capacity` slots (>= 1). `quotas`: None to create tenants on first use, sharing
        the capacity; else the tenants declared up front (a None quota joins the pool), and
        unknown tenant names raise UnknownTenant. QuotaError if the quotas exceed capacity."""
    @property
    def capacity(self) -> int: ...
    def add_tenant(self, name: str, quota: int | None = None) -> None:
        """TenantError if it exists or the name is empty; QuotaError if the quota exceeds the
        slots not yet reserved and not held by pool tenants."""
    def allocate(self, tenant: str = "default") -> tuple[int, bool]:
        """(slot, evicted): a free slot, or the least recently used slot the tenant may evict
        (its own with a quota, else the pool's). The slot becomes the tenant's most recent."""
    def allocate_many(self, count: int, tenant: str = "default") -> list[tuple[int, bool]]:
        """`count` allocations in one call, exactly as `allocate` called `count` times (if the
        first raises nothing changes; once one succeeds the rest cannot fail)."""
    def touch(self, slots: Sequence[int] | npt.NDArray[numpy.int32] | npt.NDArray[numpy.int64]) -> None:
        """Mark used slots as used, in order (the last is the most recent); one hit per entry.
        SlotError (and no change at all) if any entry is out of range or free."""
    def release(self, slot: int) -> None:
        """Free a used slot (SlotError if free or out of range); it is the next one handed out."""
    def recency(self, tenant: str | None = None) -> list[int]:
        """Used slots, least recently used first: all of them, or one tenant's."""
    def is_valid(self, slot: int) -> bool:
        """Whether the slot is used. SlotError if out of range."""
    def valid_slots(self, tenant: str | None = None) -> list[int]:
        """Used slots in ascending order: all of them, or one tenant's."""
    def owner(self, slot: int) -> str | None:
        """The owning tenant, None for a free slot. SlotError if out of range."""
    def tenants(self) -> dict[str, int | None]:
        """Tenant name -> quota (None: pool tenant), in creation order."""
    def stats(self, tenant: str | None = None) -> dict[str, int]:
        """hits, allocations, evictions, used, capacity. For a tenant: evictions counts its
        slots lost to eviction, capacity is its quota (pool tenants: the pool's size)."""
    def __len__(self) -> int:
        """Used slots."""
    def extent(self) -> tuple[int, int]:
        """(hi, n_valid): 1 + the highest slot handed out since the books were made or loaded,
        and the used slots. The books own a bank's extent: retrieval scans slots [0, hi)."""
    # Pickling (and copy.deepcopy) go through the snapshot's books encoding.
    def __getnewargs__(self) -> tuple[int]: ...
    def __getstate__(self) -> tuple[int, bytes]: ...
    def __setstate__(self, state: tuple[int, bytes]) -> None: ...

def save_snapshot(
    path: str | bytes | os.PathLike[str],
    books: Books,
    arrays: dict[str, npt.NDArray[numpy.generic]],
    meta: dict[str, str],
) -> None:
    """Write one safetensors file atomically (temp file, fsync, rename).

    arrays: exactly `keys` [N, d] float32|float16, `support` [N, m] int32|int64,
    `bias` [N, m] float32, `counts` [N] int32|int64, with N == books.capacity.
    meta: must hold `draft_fingerprint` and `config` (a JSON document); keys starting with
    `drift_bank.` are reserved. SnapshotError for input that cannot be saved or a target that
    exists and is not a regular file (never replaced), OSError for I/O.
    """

def load_snapshot(
    path: str | bytes | os.PathLike[str], expect_draft: str | None = None
) -> tuple[Books, dict[str, npt.NDArray[numpy.generic]], dict[str, str]]:
    """(books, arrays, meta) after checking everything, the values too (finite keys and biases,
    support ids and counts >= 0); SnapshotCorrupt, SnapshotVersionError or SnapshotDraftMismatch
    otherwise (FileNotFoundError / OSError for I/O, and for a path that is not a regular file,
    refused before it is opened)."""

def read_snapshot_summary(path: str | bytes | os.PathLike[str]) -> dict[str, object]:
    """A checked snapshot's summary: format_version, file_bytes, header_bytes, array_bytes,
    N, d, m, dtypes, used, stats, tenants (name -> stats + quota), draft_fingerprint,
    config (parsed), meta (other caller keys), checksum."""

# --- DRIFT's CPU arithmetic (drift-bank-core `kernels`, `cpu_bank`; Python side: drift_kernels/cpu.py)
# The functions take C-contiguous arrays: float32 keys/bias/h/z/logits, int64 support/idx/counts,
# bool valid (`CpuBank` also reads strided float32 rows, see there).
# Bank arrays (keys [N, d], support [N, m] or None for a full-vocabulary bias [N, V], bias,
# counts [N]) are written in place. Shapes are checked (ValueError).

def drift_retrieve(keys: npt.NDArray[numpy.float32], valid: npt.NDArray[numpy.bool_] | None,
                   h: npt.NDArray[numpy.float32], hi: int, k: int, inv_two_sigma_sq: float,
                   ) -> tuple[npt.NDArray[numpy.int64], npt.NDArray[numpy.float32], npt.NDArray[numpy.float32]]:
    """The k nearest of slots [0, hi) for each row of h [Q, d]: (idx, sim, weight) [Q, k], most
    similar first, ties to the lower slot, -1 / -inf / 0 where fewer than k are valid."""

def drift_bias_add(z: npt.NDArray[numpy.float32], idx: npt.NDArray[numpy.int64], weight: npt.NDArray[numpy.float32],
                   support: npt.NDArray[numpy.int64] | None, bias: npt.NDArray[numpy.float32], gain: float,
                   ) -> npt.NDArray[numpy.float32]:
    """z [Q, V] + λβ as a new array (bit-identical to drift_kernels.reference.bias_add)."""

def drift_ema(keys: npt.NDArray[numpy.float32], bias: npt.NDArray[numpy.float32], counts: npt.NDArray[numpy.int64],
              slots: Sequence[int], residual: npt.NDArray[numpy.float32], h: npt.NDArray[numpy.float32],
              eta: float, adaptive: bool) -> None:
    """The EMA step for row i of residual/h into slots[i], in order, in place."""

class CpuBank:
    """A CPU bank's per-token and per-iteration DRIFT work, one call each, on the bank tensors'
    own memory: keys [N, d] float32, valid [N] bool, support [N, m] int64 (None: a full-vocabulary
    bias [N, V]), bias, counts [N] int64, all C-contiguous and written in place. `h`, `z`, `logp`,
    `logq` may be float32 numpy arrays or CPU torch tensors at any strides with contiguous rows
    (read in place). Bad shapes or dtypes raise ValueError."""

    def __init__(self, keys: npt.NDArray[numpy.float32], valid: npt.NDArray[numpy.bool_],
                 support: npt.NDArray[numpy.int64] | None, bias: npt.NDArray[numpy.float32],
                 counts: npt.NDArray[numpy.int64], books: object, tenant: str, k: int, inv_two_sigma_sq: float,
                 gain: float, tau: float, eta: float, adaptive: bool, used_weight: float) -> None:
        """`books`: the extension's `Books` (ValueError otherwise), which own the bank's extent."""

    def begin(self) -> None:
        """A new proposal: forget the last one's recorded retrievals."""
    def step(self, h: _Rows, z: _Rows, out: npt.NDArray[numpy.float32]) -> bool:
        """One draft step for h [Q, d], z [Q, V]: the k nearest of slots [0, hi) (the books'
        `extent`; recorded),
        then out [Q, V] = z + λβ (bit-identical to drift_kernels.reference.bias_add). False,
        with `out` untouched, when the logits are unchanged (an empty bank, or λ = 0)."""
    def drafted(self, b: int, steps: int) -> tuple[npt.NDArray[numpy.int64], npt.NDArray[numpy.float32],
                                                   npt.NDArray[numpy.float32]]:
        """The first `steps` recorded draft steps for a batch of b: (idx, sim, weight) [b·steps, k]
        batch-major copies (-1 / -inf / 0 for a row drafted while the bank was empty)."""
    def observe(self, h: _Rows, logp: _Rows, logq: _Rows, steps: int, temperature: float = 1.0,
                idx: npt.NDArray[numpy.int64] | None = None, sim: npt.NDArray[numpy.float32] | None = None,
                weight: npt.NDArray[numpy.float32] | None = None,
                ) -> tuple[int, int, int, list[tuple[int, int]], list[tuple[int, int]], list[float], list[int]]:
        """One iteration's DRIFT update with the books, drafted positions in order, in place: match
        (nearest within tau), touch the used slots once each, matched updates (support refresh,
        residual, EMA), one allocation per other position (K = ĥ, S = top-m of max(p, q), B = r on S,
        n = 1), mark new slots valid. h [B, T, d], logp/logq [B, T', V] (positions (i, t < steps),
        batch-major; 2-D [P, .] arrays as they are), log-probabilities at `temperature` (divided
        here; unnormalised will do). The neighbours are the recorded draft steps', or idx/sim/weight
        [P, k'] when given. Equal to drift_kernels.reference.observe. Returns (updated, refreshed,
        evicted, [(position, slot)] allocated in order, [(position, slot)] matched in order, [the
        EMA rate of each matched update], [slots that became valid])."""


# --- The CPU skinny GEMM (drift-bank-core `skinny`; Python side: drift_cli/engine/cpu_linear.py)

def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  threads: int) -> None:
    """out [..., N] = x [..., K] · weight [N, K]ᵀ (+ bias [N]): float32 CPU tensors, contiguous,
    `out` distinct from the inputs (ValueError otherwise). Each weight is read once whatever the
    rows; a row's outputs are bitwise the same whatever the other rows. Runs on `threads` threads
    (the caller's and a persistent pool), the GIL released."""



def read_sum(tensors: list[torch.Tensor], threads: int) -> float:
    """The sum of every element of `tensors` (float32 CPU tensors, contiguous; ValueError
    otherwise), read on `threads` threads as the skinny GEMM reads a weight, the GIL released:
    the weight-read floor's timed read (drift_cli/engine/floor.py)."""

# --- A Llama layer's pieces fused with the skinny GEMM (drift-bank-core `layer`; Python side:
# drift_cli/engine/lean.py). float32 CPU tensors; ValueError on shapes that disagree or an output
# that overlaps an input; the GIL released.

def skinny_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, weights: list[torch.Tensor],
                       out: torch.Tensor, add: bool, threads: int) -> None:
    """out [..., Σ N_i] = RMSNorm(x) (where norm_weight is given) · [W_1; W_2; ...]ᵀ, each weight's
    outputs side by side (q, k, v into one buffer); add: added into out (a residual stream)."""

def skinny_mlp(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate: torch.Tensor, up: torch.Tensor,
               down: torch.Tensor, threads: int) -> None:
    """h [..., d] += down(silu(gate(n)) · up(n)), n = RMSNorm(h), in place."""

def attend_few(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float,
               out: torch.Tensor, threads: int = 1) -> None:
    """out [R, S, Hq·D] = softmax(q·Kᵀ·scale + mask)·V for q [R, S, Hq, D] over keys/values
    [R, Hkv, L, D] (grouped heads read in place; strided views with a contiguous last dimension);
    mask: additive, [S, L] for every row or [R, 1, S, L]. On `threads` threads, the same bits on
    any number."""

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """out [..., d] = x · (1 / sqrt(mean(x²) + eps)) · weight, the mean accumulated in f64 per row."""

class DecoderPlan:
    """A Llama decoder's weights, held, for a whole few-token step of one sequence in one call
    (drift-bank-core `layer::decoder_step`; Python side: `lean.LeanDecoder._step`). The weights
    are read at every step, never copied; their addresses are checked at every step."""

    def __init__(self, weights: list[torch.Tensor], final_norm: torch.Tensor, heads: int, kv_heads: int,
                 head_dim: int, eps: float, scale: float) -> None:
        """weights: 9 per layer (input norm [d], q [Hq·D, d], k and v [Hkv·D, d], o [d, Hq·D], post
        norm [d], gate and up [F, d], down [d, F]); ValueError where they are not a Llama layer."""

    def current(self) -> bool:
        """Whether every weight is still where the plan found it."""

    def step(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor, start: int,
             mask: torch.Tensor | None, record: list[int], recorded: torch.Tensor | None, out: torch.Tensor,
             threads: int) -> bool:
        """h [1, S, d] (updated in place) through every layer; out [1, S, d] = the final RMSNorm.
        cos, sin [1, S, D]; cache [layers, 2, 1, Hkv, capacity, D], positions start .. start + S
        written; mask [S, start + S] additive (None for S = 1); the inputs of the layers in
        `record` (ascending) into recorded [len(record), 1, S, d]. False, with nothing computed,
        where a weight moved; ValueError on shapes that disagree or outputs that alias."""
