"""The method registry: `--methods all` means every method registered here, in this order.

The built-in methods come first, in the order below; then every method a installed package
declares as an entry point of the group `drift_bench.methods` (as lm-evaluation-harness finds
model backends), name = the method's name, value = its `DraftPolicy` subclass:

    [project.entry-points."drift_bench.methods"]
    echo = "my_package.echo:Echo"

A plugin method's `configs` become flags of `drift bench` like the built-in ones'.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

from drift_cli.engine.gamma import GammaConfig
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import DraftPolicy
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.hybrid import Hybrid
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.errors import BadInput
from drift_cli.registry import Registry

METHODS: Registry[type[DraftPolicy]] = Registry("method")
ENTRY_POINT_GROUP = "drift_bench.methods"
for _cls in (Autoregressive, Vanilla, DriftMethod, Offline, OnlineDistillation, PromptLookup, SuffixDecoding, Hybrid):
    METHODS.register(_cls.name)(_cls)


def load_plugins(registry: Registry[type[DraftPolicy]] = METHODS) -> list[str]:
    """Registers the methods of the `drift_bench.methods` entry points; returns their names. One
    that fails to load, or is not a `DraftPolicy` named as its entry point, is skipped with a warning."""
    added = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in registry:
            continue
        try:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, DraftPolicy) and cls.name == ep.name):
                raise TypeError(f"{ep.value} is not a DraftPolicy subclass named {ep.name!r}")
        except Exception as e:  # noqa: BLE001 - a broken plugin must not break the built-in methods
            warnings.warn(f"method plugin {ep.name!r} ({ep.value}) not loaded: {e}", stacklevel=2)
            continue
        registry.register(ep.name)(cls)
        added.append(ep.name)
    return added


load_plugins()


def resolve_methods(spec: str) -> list[str]:
    """'all' or a comma-separated list -> validated method names (BadInput on unknown names, an
    empty list or a name given twice)."""
    if spec.strip() == "all":
        return METHODS.names()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BadInput(f"--methods {spec!r} names no method; give 'all' or a comma-separated list such as vanilla,drift")
    for n in names:
        METHODS[n]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInput(f"--methods names {', '.join(twice)} more than once")
    return names


def settings_classes(names: list[str] | None = None) -> list[type]:
    """The settings dataclasses of these registered methods (default: all), each once, in order,
    after the γ controller's (`--gamma-policy`, which every drafting method composes with)."""
    out: list[type] = [GammaConfig]
    for name in METHODS.names() if names is None else names:
        out += [c for c in METHODS[name].configs if c not in out]
    return out
