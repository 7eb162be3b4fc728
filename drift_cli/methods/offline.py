"""`offline`: the draft fine-tuned offline on the scenario's train split by distillation from the
target (the strong reference; built and cached by the zoo, or given with --offline-draft)."""

from __future__ import annotations

from pathlib import Path

from drift_cli.errors import BadInput
from drift_cli.methods.base import MethodContext, ModelDraftPolicy
from drift_cli.methods.settings import OfflineConfig


class Offline(ModelDraftPolicy):
    name = "offline"
    description = "the draft distilled offline on the scenario's train split"

    @classmethod
    def build(cls, ctx: MethodContext) -> "Offline":
        cfg = ctx.config(OfflineConfig)
        path = cfg.draft
        if path is None:
            if ctx.resolve_offline is None:
                raise BadInput("the offline method needs --offline-draft PATH")
            path = ctx.resolve_offline(cfg.divergence, cfg.on_policy)
        if ctx.load_draft is None:
            raise BadInput("the offline method cannot load a draft in this context")
        return cls(ctx.load_draft(Path(path)))
