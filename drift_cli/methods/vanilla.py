"""`vanilla`: speculative decoding with the static draft.

With `--residuals N` it also keeps the draft's residual at up to N rejected positions and
reports their spectrum (`drift_cli.residuals`) in run.json's `methods.vanilla.report`."""

from __future__ import annotations

from typing import Any

import torch

from drift_cli.methods.base import Feedback, MethodContext, ModelDraftPolicy
from drift_cli.methods.settings import ResidualConfig
from drift_cli.residuals import ResidualRecorder, spectrum


class Vanilla(ModelDraftPolicy):
    name = "vanilla"
    description = "speculative decoding with the static draft"

    def __init__(self, draft: torch.nn.Module, residuals: int = 0) -> None:
        super().__init__(draft)
        self.recorder = ResidualRecorder(residuals)

    @classmethod
    def build(cls, ctx: MethodContext) -> "Vanilla":
        assert ctx.draft is not None, f"method {cls.name} needs a draft model"
        return cls(ctx.draft, ctx.config(ResidualConfig).validate().residuals)

    def begin_stream(self) -> None:
        self.recorder.rows.clear()

    def observe(self, feedback: Feedback) -> None:
        self.recorder.observe(feedback)

    def report(self) -> dict[str, Any]:
        if self.recorder.limit <= 0:
            return {}
        if len(self.recorder.rows) < 2:
            return {"residual_spectrum": None,
                    "residual_spectrum_error": f"only {len(self.recorder.rows)} rejected positions"}
        return {"residual_spectrum": spectrum(self.recorder.rows)}
