"""`offline`: the draft fine-tuned offline on the scenario's train split by distillation from the
target (the strong reference; built and cached by the zoo, or given with --offline-draft)."""

from __future__ import annotations

from pathlib import Path

import click

from drift_cli.divergence import DIVERGENCES
from drift_cli.errors import BadInput
from drift_cli.methods.base import MethodContext, ModelDraftPolicy


class Offline(ModelDraftPolicy):
    name = "offline"
    description = "the draft distilled offline on the scenario's train split"
    cli_options = [
        click.Option(["--offline-draft"], type=str, default=None,
                     help="offline draft checkpoint (default: the zoo's, built on demand)"),
        click.Option(["--divergence"], type=click.Choice(DIVERGENCES), default="fkl", show_default=True,
                     help="distillation divergence of the offline draft (and of osd)"),
    ]

    @classmethod
    def build(cls, ctx: MethodContext) -> "Offline":
        path = ctx.options.get("offline_draft")
        if path is None:
            if ctx.resolve_offline is None:
                raise BadInput("the offline method needs --offline-draft PATH")
            path = ctx.resolve_offline(ctx.options.get("divergence") or "fkl")
        if ctx.load_draft is None:
            raise BadInput("the offline method cannot load a draft in this context")
        return cls(ctx.load_draft(Path(path)))
