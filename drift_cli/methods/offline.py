"""`offline`: the draft fine-tuned offline on the scenario's train split by distillation from the
target (the strong reference; built and cached by the zoo, or given with --offline-draft)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from drift_cli.divergence import divergence_knob
from drift_cli.errors import BadInput
from drift_cli.knobs import Settings, knob
from drift_cli.methods.base import MethodContext, ModelDraftPolicy


@dataclass(frozen=True)
class OfflineConfig(Settings):
    draft: str | None = knob(None, "--offline-draft", "offline draft checkpoint (default: the zoo's, built on demand)")
    divergence: str = divergence_knob()
    # the zoo's offline draft distilled on sequences the draft itself generated (on-policy data)
    on_policy: bool = knob(False, "--offline-on-policy", "offline: the zoo's draft distilled on on-policy data "
                           "(sequences the draft generates) instead of off-policy text", off_flag="--offline-off-policy")


class Offline(ModelDraftPolicy):
    name = "offline"
    description = "the draft distilled offline on the scenario's train split"
    configs = (OfflineConfig,)

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
