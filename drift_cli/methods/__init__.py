"""The method registry: `--methods all` means every method registered here, in this order.

Each entry names the method, where its `DraftPolicy` class lives and which settings classes it
reads. The class is imported on first lookup (`METHODS[name]`): the command line lists, checks
and documents every method's flags from the settings alone, without importing torch.

The built-in methods come first, in the order below; then every method a installed package
declares as an entry point of the group `drift_bench.methods` (as lm-evaluation-harness finds
model backends), name = the method's name, value = its `DraftPolicy` subclass:

    [project.entry-points."drift_bench.methods"]
    echo = "my_package.echo:Echo"

A plugin method's `configs` become flags of `drift bench` like the built-in ones'.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from drift_cli.drift.config import DriftConfig, DriftFiles
from drift_cli.engine.gamma import GammaConfig
from drift_cli.engine.tree import TreeConfig
from drift_cli.errors import BadInput
from drift_cli.methods.settings import HybridConfig, OfflineConfig, PldConfig, ResidualConfig, SuffixConfig
from drift_cli.osd.config import OSDConfig
from drift_cli.registry import Registry

if TYPE_CHECKING:
    from drift_cli.engine.policy import DraftPolicy


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its name, its class ("module:Class", or the class itself for a
    plugin, which is loaded to be found) and the settings classes it reads."""

    name: str
    target: Any                           # "drift_cli.methods.pld:PromptLookup" or a DraftPolicy subclass
    configs: tuple[type, ...] = ()

    def load(self) -> type[DraftPolicy]:
        if not isinstance(self.target, str):
            return self.target
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


class MethodRegistry(Registry[MethodSpec]):
    """`METHODS[name]` is the method's class (imported on first use); `spec(name)` its entry."""

    def spec(self, name: str) -> MethodSpec:
        return super().__getitem__(name)

    def __getitem__(self, name: str) -> type[DraftPolicy]:   # type: ignore[override]
        return self.spec(name).load()

    def add(self, spec: MethodSpec) -> None:
        self.register(spec.name)(spec)


METHODS = MethodRegistry("method")
ENTRY_POINT_GROUP = "drift_bench.methods"
for _spec in (
    MethodSpec("ar", "drift_cli.methods.ar:Autoregressive"),
    MethodSpec("vanilla", "drift_cli.methods.vanilla:Vanilla", (ResidualConfig,)),
    MethodSpec("drift", "drift_cli.methods.drift:DriftMethod", (DriftConfig, DriftFiles)),
    MethodSpec("offline", "drift_cli.methods.offline:Offline", (OfflineConfig,)),
    MethodSpec("osd", "drift_cli.methods.osd:OnlineDistillation", (OSDConfig,)),
    MethodSpec("pld", "drift_cli.methods.pld:PromptLookup", (PldConfig,)),
    MethodSpec("suffix", "drift_cli.methods.suffix:SuffixDecoding", (SuffixConfig,)),
    MethodSpec("hybrid", "drift_cli.methods.hybrid:Hybrid", (HybridConfig,)),
):
    METHODS.add(_spec)


def load_plugins(registry: MethodRegistry = METHODS) -> list[str]:
    """Registers the methods of the `drift_bench.methods` entry points; returns their names. One
    that fails to load, or is not a `DraftPolicy` named as its entry point, is skipped with a warning."""
    added = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in registry:
            continue
        try:
            from drift_cli.engine.policy import DraftPolicy

            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, DraftPolicy) and cls.name == ep.name):
                raise TypeError(f"{ep.value} is not a DraftPolicy subclass named {ep.name!r}")
        except Exception as e:  # noqa: BLE001 - a broken plugin must not break the built-in methods
            warnings.warn(f"method plugin {ep.name!r} ({ep.value}) not loaded: {e}", stacklevel=2)
            continue
        registry.add(MethodSpec(ep.name, cls, tuple(cls.configs)))
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
        METHODS.spec(n)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInput(f"--methods names {', '.join(twice)} more than once")
    return names


def method_settings(name: str) -> tuple[type, ...]:
    """The settings classes method `name` reads (without importing the method)."""
    return METHODS.spec(name).configs


def settings_classes(names: list[str] | None = None) -> list[type]:
    """The settings dataclasses of these registered methods (default: all), each once, in order,
    after the γ controller's (`--gamma-policy`) and the tree's (`--tree-nodes`), which every
    drafting method composes with."""
    out: list[type] = [GammaConfig, TreeConfig]
    for name in METHODS.names() if names is None else names:
        out += [c for c in method_settings(name) if c not in out]
    return out


def with_sources(names: set[str], options: dict[str, Any]) -> set[str]:
    """`names` with the methods a composed method runs inside itself (`hybrid`: its copying and
    model sources, whose own settings it reads)."""
    if "hybrid" not in names:
        return names
    default = HybridConfig()
    return names | {options.get("hybrid_copy") or default.copy, options.get("hybrid_model") or default.model}


def owners(cls: type) -> list[str]:
    """The registered methods that read settings class `cls` (the γ controller's: every method
    that drafts, which is every method but `ar`)."""
    if cls is GammaConfig:
        return [n for n in METHODS.names() if n != "ar"]
    return [n for n in METHODS.names() if cls in method_settings(n)]
