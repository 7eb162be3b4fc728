"""The DRIFT configuration: every knob of DESIGN.md "DRIFT, precisely" as one dataclass.

Defaults are frozen here after tuning on dev streams only (jargon and code dev splits of the
small zoo build small-ebc8bc8c66e7; the record is in docs/drift.md). Never tune them on test
streams.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from drift_cli.errors import require

KEYS = ("draft", "target-est")


@dataclass(frozen=True)
class DriftConfig:
    gain: float = 1.0            # λ: scale of the bias added to the draft logits
    eta: float = 0.1             # η: EMA rate (the floor of the adaptive rate)
    tau: float = 0.99            # τ: cosine similarity needed to update a prototype (else allocate)
    neighbors: int = 1           # k: prototypes retrieved per draft position
    sigma: float = 0.25          # σ: width of the Gaussian kernel over cosine distance
    bank_size: int = 1024        # N: prototypes per tenant bank
    support: int = 32            # m: tokens per prototype; 0 = the full vocabulary
    adaptive_rate: bool = True   # η_i = max(η, 1/(n_i + 1))
    key: str = "draft"           # what the prototypes are keyed on: the draft's hidden state, or the
    #                              target's estimated from it by a ridge map (drift_cli/drift/keymap.py)

    def validate(self, vocab_size: int | None = None) -> "DriftConfig":
        checks = [
            (self.gain >= 0.0, f"--gain must be >= 0, got {self.gain}"),
            (0.0 < self.eta <= 1.0, f"--eta must be in (0, 1], got {self.eta}"),
            (-1.0 <= self.tau <= 1.0, f"--tau is a cosine similarity in [-1, 1], got {self.tau}"),
            (self.neighbors >= 1, f"--neighbors must be >= 1, got {self.neighbors}"),
            (self.sigma > 0.0, f"--sigma must be > 0, got {self.sigma}"),
            (self.bank_size >= 1, f"--bank-size must be >= 1, got {self.bank_size}"),
            (self.support >= 0, f"--support must be >= 0 (0 = full vocabulary), got {self.support}"),
            (self.key in KEYS, f"--key must be one of {', '.join(KEYS)}, got {self.key!r}"),
        ]
        if vocab_size is not None:
            checks.append((self.support <= vocab_size,
                           f"--support {self.support} exceeds the vocabulary size {vocab_size}"))
        require(checks)
        return self

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "DriftConfig":
        """Click option values (None = default) -> config. Option names are the field names."""
        given = {f.name: options[f.name] for f in fields(cls) if options.get(f.name) is not None}
        return cls(**given)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DriftConfig":
        data = json.loads(text)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
