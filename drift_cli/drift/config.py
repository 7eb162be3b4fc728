"""The DRIFT configuration: every knob of the DRIFT algorithm (docs/drift.md) as one dataclass.

Defaults are frozen here after tuning on dev streams only (jargon and code dev splits of the
small zoo build small-ebc8bc8c66e7; the record is in docs/drift.md). Never tune them on test
streams.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from drift_cli import knobs
from drift_cli.errors import require
from drift_cli.knobs import Settings, at_least, between, knob

KEYS = ("draft", "target-est")
# The books' capacity limit (`drift_bank_core::MAX_CAPACITY`, 2^26 slots).
MAX_BANK_SIZE = 1 << 26
MAX_GAIN = 100.0
BOOKS_BYTES_PER_SLOT = 32     # the Rust books' LRU links and tenant tag per slot (an upper estimate)
SIGMA_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class DriftConfig(Settings):
    # λ: scale of the bias added to the draft logits
    gain: float = knob(1.0, "--gain", "DRIFT: bias gain λ", ok=between(0.0, MAX_GAIN),
                       rule=f"must be in [0, {MAX_GAIN:g}] (λβ is added to the draft's logits)")
    # η: EMA rate (the floor of the adaptive rate)
    eta: float = knob(0.1, "--eta", "DRIFT: EMA rate η (floor of the adaptive rate)",
                      ok=lambda x: 0.0 < x <= 1.0, rule="must be in (0, 1]")
    # τ: cosine similarity needed to update a prototype (else allocate)
    tau: float = knob(0.99, "--tau", "DRIFT: similarity threshold τ to update instead of allocate",
                      ok=between(-1.0, 1.0), rule="is a cosine similarity in [-1, 1]")
    # k: prototypes retrieved per draft position
    neighbors: int = knob(1, "--neighbors", "DRIFT: prototypes retrieved per position (k)",
                          ok=at_least(1), rule="must be >= 1")
    # σ: width of the Gaussian kernel over cosine distance
    sigma: float = knob(0.25, "--sigma", "DRIFT: Gaussian kernel width σ over cosine distance",
                        ok=between(*SIGMA_RANGE), rule=f"must be in [{SIGMA_RANGE[0]:g}, {SIGMA_RANGE[1]:g}] (a width "
                        "over cosine distance, which is at most 2; the kernel takes 1/(2σ²) in float32)")
    # N: prototypes per tenant bank
    bank_size: int = knob(1024, "--bank-size", "DRIFT: prototypes per tenant bank (N)",
                          ok=between(1, MAX_BANK_SIZE), rule=f"must be in [1, {MAX_BANK_SIZE}]")
    # m: tokens per prototype; 0 = the full vocabulary
    support: int = knob(32, "--support", "DRIFT: support tokens per prototype (m; 0 = full vocabulary)",
                        ok=at_least(0), rule="must be >= 0 (0 = full vocabulary)")
    # η_i = max(η, 1/(n_i + 1))
    adaptive_rate: bool = knob(True, "--adaptive-rate", "DRIFT: per-prototype rate max(η, 1/(n+1))",
                               off_flag="--no-adaptive-rate")
    # what the prototypes are keyed on: the draft's hidden state, or the target's estimated from
    # it by a ridge map (drift_cli/drift/keymap.py)
    key: str = knob("draft", "--key", "DRIFT: key on the draft hidden state or an estimated target one",
                    choices=KEYS)

    def validate(self, vocab_size: int | None = None) -> "DriftConfig":
        knobs.check(self)
        require([(self.neighbors <= self.bank_size, f"--neighbors {self.neighbors} exceeds --bank-size "
                  f"{self.bank_size}: a position retrieves at most the bank's prototypes")])
        if vocab_size is not None:
            require([(self.support <= vocab_size,
                      f"--support {self.support} exceeds the vocabulary size {vocab_size}")])
        return self

    def bank_bytes(self, dim: int, vocab: int, key_bytes: int) -> int:
        """Memory of one tenant bank (`drift_cli.drift.bank`): keys [N, d], support [N, m] int64,
        biases [N, m or V] fp32, counts int64 and validity per prototype, and the books' slots."""
        width = self.support or vocab
        per_prototype = dim * key_bytes + 8 * self.support + 4 * width + 8 + 1 + BOOKS_BYTES_PER_SLOT
        return self.bank_size * per_prototype

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DriftConfig":
        data = json.loads(text)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class DriftFiles(Settings):
    """DRIFT's snapshot files (not part of the bank's configuration). Read by the `drift` method
    alone: a hybrid whose model source is DRIFT keeps its bank to itself (two methods of one run
    never read or write one bank file)."""

    method_only: ClassVar[bool] = True         # not read by a method that runs drift as its source

    bank_in: Path | None = knob(None, "--bank-in", "DRIFT: warm-start from a bank snapshot", kind=Path)
    bank_out: Path | None = knob(None, "--bank-out", "DRIFT: save the bank(s) after the stream", kind=Path)
