"""The method registry: `--methods all` means every method registered here, in this order."""

from __future__ import annotations

from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import DraftPolicy
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.registry import Registry

METHODS: Registry[type[DraftPolicy]] = Registry("method")
for _cls in (Autoregressive, Vanilla, DriftMethod, Offline, OnlineDistillation, PromptLookup, SuffixDecoding):
    METHODS.register(_cls.name)(_cls)


def resolve_methods(spec: str) -> list[str]:
    """'all' or a comma-separated list -> validated method names (BadInput on unknown names)."""
    if spec.strip() == "all":
        return METHODS.names()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    for n in names:
        METHODS[n]
    return names


def settings_classes(names: list[str] | None = None) -> list[type]:
    """The settings dataclasses of these registered methods (default: all), each once, in order."""
    out: list[type] = []
    for name in METHODS.names() if names is None else names:
        out += [c for c in METHODS[name].configs if c not in out]
    return out
