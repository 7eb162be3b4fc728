"""A third-party drafting method for the plugin test (tests/test_plugins.py): `echo` drafts the
last context token repeated, a point mass, with one setting of its own (--echo-length).

It is found through the entry point declared in drift_echo-0.1.dist-info (group
`drift_bench.methods`), as an installed package's would be, when this directory is on sys.path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from drift_cli.engine.sampling import Sampler
from drift_cli.knobs import Settings, at_least, knob
from drift_cli.methods.base import DraftPolicy, MethodContext, Proposal, Rows, as_rows


@dataclass(frozen=True)
class EchoConfig(Settings):
    length: int = knob(2, "--echo-length", "echo: tokens drafted per iteration", ok=at_least(1), rule="must be >= 1")


class Echo(DraftPolicy):
    name = "echo"
    description = "drafts the last token again (a plugin method)"
    configs = (EchoConfig,)

    def __init__(self, cfg: EchoConfig) -> None:
        self.cfg = cfg.validate()
        self.proposals = 0

    @classmethod
    def build(cls, ctx: MethodContext) -> "Echo":
        return cls(ctx.config(EchoConfig))

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        self.proposals += 1
        last = torch.stack([ids[-1:] for ids in as_rows(context).ids])      # [B, 1] each row's last token
        return Proposal(tokens=last.repeat(1, min(gamma, self.cfg.length)))

    def report(self) -> dict[str, Any]:
        return {"echo_length": self.cfg.length, "proposals": self.proposals}
