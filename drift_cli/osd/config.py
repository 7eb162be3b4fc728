"""OSD settings: one dataclass, the defaults live here and nowhere else."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from drift_cli.divergence import DIVERGENCES
from drift_cli.errors import BadInput

# CLI option name (without the leading "--", dashes as underscores) -> config field.
OPTION_FIELDS = {
    "osd_interval": "interval",
    "osd_steps": "steps",
    "osd_batch": "batch",
    "osd_lr": "lr",
    "osd_clip": "clip",
    "osd_buffer": "buffer",
    "osd_topk": "topk",
    "osd_all_positions": "all_positions",
    "divergence": "divergence",
}


@dataclass(frozen=True)
class OSDConfig:
    # Defaults tuned on the `small` zoo's dev streams of jargon and code (docs/osd.md, "Tuning").
    interval: float = 4.0        # U: an update after every U verification steps; inf = never (frozen draft)
    steps: int = 4               # AdamW steps per update
    batch: int = 16              # buffered positions per AdamW step (fewer while the buffer is smaller)
    lr: float = 1e-3             # AdamW learning rate (constant)
    clip: float = 1.0            # max global gradient norm; 0 = no clipping
    buffer: int = 512            # replay buffer capacity in positions (FIFO)
    topk: int = 64               # target support stored per position; 0 (or >= V) = the full distribution
    all_positions: bool = False  # buffer every drafted position, not only the rejected one
    divergence: str = "fkl"      # loss between the target's and the draft's distributions
    weight_decay: float = 0.0    # AdamW decoupled weight decay (OSD's online path: HF Trainer default 0)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "OSDConfig":
        """Options as the CLI passes them (None = not given, keep the default)."""
        given = {f: options[o] for o, f in OPTION_FIELDS.items() if options.get(o) is not None}
        return cls(**given)

    @property
    def frozen(self) -> bool:
        return math.isinf(self.interval)

    def validate(self) -> "OSDConfig":
        if not (self.interval >= 1 and (math.isinf(self.interval) or float(self.interval).is_integer())):
            raise BadInput(f"--osd-interval must be a whole number >= 1 or inf, got {self.interval}")
        for name in ("steps", "batch", "buffer"):
            if getattr(self, name) < 1:
                raise BadInput(f"--osd-{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise BadInput(f"--osd-lr must be > 0, got {self.lr}")
        if not self.clip >= 0:
            raise BadInput(f"--osd-clip must be >= 0 (0 = off), got {self.clip}")
        if self.topk < 0:
            raise BadInput(f"--osd-topk must be >= 0 (0 = full distribution), got {self.topk}")
        if self.divergence not in DIVERGENCES:
            from drift_cli.registry import unknown

            raise unknown("divergence", self.divergence, DIVERGENCES)
        return self

    def due(self, step: int) -> bool:
        """Does an update fire after verification step `step` (0-based, counted over the stream)?"""
        return not self.frozen and (step + 1) % int(self.interval) == 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = "inf" if self.frozen else int(self.interval)  # JSON has no infinity
        return out


assert set(OPTION_FIELDS.values()) <= {f.name for f in fields(OSDConfig)}
