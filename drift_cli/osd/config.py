"""OSD settings: one dataclass, the defaults live here and nowhere else."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from drift_cli.errors import BadInput
from drift_cli.knobs import Settings, at_least, between, knob
from drift_cli.methods.settings import divergence_knob

MAX_STEPS = 1000
MAX_LR = 1.0
MAX_CLIP = 1e6        # a norm beyond float32's comfort; 0 turns clipping off
MAX_BUFFER = 2**31 - 1
MAX_THREADS = 1024


TRAINED = ("all", "last", "head")


def _whole_or_inf(x: float) -> bool:
    return x >= 1 and (math.isinf(x) or float(x).is_integer())


@dataclass(frozen=True)
class OSDConfig(Settings):
    # Defaults tuned on the `small` zoo's dev streams of jargon and code (docs/osd.md, "Tuning").
    # U: an update after every U verification steps; inf = never (frozen draft)
    interval: float = knob(4.0, "--osd-interval", "OSD: update after every U verification steps; inf = never",
                           ok=_whole_or_inf, rule="must be a whole number >= 1 or inf")
    steps: int = knob(4, "--osd-steps", "OSD: AdamW steps per update", ok=between(1, MAX_STEPS),
                      rule=f"must be in [1, {MAX_STEPS}] (the steps of one update run inside one verification step)")
    # buffered positions per AdamW step (fewer while the buffer is smaller)
    batch: int = knob(16, "--osd-batch", "OSD: buffered positions per AdamW step", ok=at_least(1), rule="must be >= 1")
    lr: float = knob(1e-3, "--osd-lr", "OSD: AdamW learning rate", ok=lambda x: 0 < x <= MAX_LR,
                     rule=f"must be in (0, {MAX_LR:g}] (AdamW moves each weight by about lr per step)")  # constant
    clip: float = knob(1.0, "--osd-clip", "OSD: max gradient norm, 0 = off", ok=between(0.0, MAX_CLIP),
                       rule=f"must be in [0, {MAX_CLIP:g}] (0 = off)")
    buffer: int = knob(512, "--osd-buffer", "OSD: replay buffer capacity in positions", ok=between(1, MAX_BUFFER),
                       rule=f"must be in [1, {MAX_BUFFER}]")          # FIFO
    # target support stored per position; 0 (or >= V) = the full distribution
    topk: int = knob(64, "--osd-topk", "OSD: target probabilities kept per position, 0 = full distribution",
                     ok=at_least(0), rule="must be >= 0 (0 = full distribution)")
    all_positions: bool = knob(False, "--osd-all-positions",
                               "OSD: buffer every drafted position, not only the rejected one")
    # what an update trains: every parameter; the last decoder layer, the final norm and the head;
    # or the head alone (a subset draft's head as its subset's rows); docs/osd.md, "What an update trains"
    train: str = knob("all", "--osd-train", "OSD: what an update trains: all (every draft parameter), last "
                      "(the last decoder layer, the final norm and the head) or head (the output head alone: "
                      "the KV cache stays valid, no re-prefill)", choices=TRAINED)
    divergence: str = divergence_knob()   # loss between the target's and the draft's distributions
    # updates on a background worker thread that trains its own copy and publishes finished weights;
    # the decoder swaps the newest in before a proposal (docs/osd.md, "Background distillation")
    background: bool = knob(False, "--osd-async", "OSD: run updates on a background worker thread (its own copy "
                            "of the trainable weights); the decoder swaps the newest finished weights in at an "
                            "iteration boundary and never waits for an update")
    # the worker's torch intra-op threads; None: the run's --threads (torch's count is process-wide:
    # a worker thread cannot hold one of its own, so another value is refused; drift_cli/osd/worker.py)
    threads: int | None = knob(None, "--osd-threads", "OSD: the background worker's torch threads (with "
                               "--osd-async; torch's count is process-wide, so it must equal --threads, "
                               "default 1)", kind=int, ok=between(1, MAX_THREADS),
                               rule=f"must be in [1, {MAX_THREADS}]")
    weight_decay: float = 0.0    # AdamW decoupled weight decay (OSD's online path: HF Trainer default 0)

    def validate(self) -> "OSDConfig":
        super().validate()
        if self.threads is not None and not self.background:
            raise BadInput("--osd-threads sets the background worker's threads: it needs --osd-async")
        return self

    @property
    def frozen(self) -> bool:
        return math.isinf(self.interval)

    def due(self, step: int) -> bool:
        """Does an update fire after verification step `step` (0-based, counted over the stream)?"""
        return not self.frozen and (step + 1) % int(self.interval) == 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = "inf" if self.frozen else int(self.interval)  # JSON has no infinity
        return out
