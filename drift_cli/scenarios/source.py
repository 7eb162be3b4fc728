"""What a scenario's source is and how its text is extracted: `SourceSpec` and the extractor
registry (a leaf: `schema` parses specs, `extractors` and `corpus` register extractors, `build`
runs them; none of them imports another for these).

An extractor takes the source spec and its sorted file list and yields `RawDoc`s; it registers
with `@extractor(name)` into `EXTRACTORS`, a `drift_cli.registry.Registry` like the methods',
so an unknown name fails with the same "did you mean" `BadInput`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from drift_cli.registry import Registry


@dataclass(frozen=True)
class SourceSpec:
    """One extractor applied to files under `root` (sorted glob of `include` minus `exclude`)."""

    id: str                         # unique within the scenario, e.g. "stdlib"
    extractor: str                  # a name in EXTRACTORS
    package: str                    # OS package that provides the files ("" for user data)
    licence: str                    # licence of the text, as declared by the package
    root: str                       # directory (or single file) the globs are relative to
    include: tuple[str, ...] = ("**/*",)
    exclude: tuple[str, ...] = ()
    domain: str = ""                # Document.domain; defaults to the scenario's domain
    max_bytes: int = 0              # budget of cleaned text kept (0: all); subset by id hash
    options: tuple[tuple[str, Any], ...] = ()   # extractor-specific settings, sorted items

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)


@dataclass(frozen=True)
class RawDoc:
    locator: str           # unique within the source: a path, or path@first-entry
    text: str
    file: str              # the file it came from (for the manifest)
    date: str | None = None
    domain: str | None = None  # overrides the source's domain (multilingual pages)


Extractor = Callable[[SourceSpec, list[Path]], Iterator[RawDoc]]
EXTRACTORS: Registry[Extractor] = Registry("extractor")
# extractor name -> (spec, root, sorted files) -> the files it reads (hashed into cache keys)
FILE_FILTERS: dict[str, Callable[[SourceSpec, Path, list[Path]], list[Path]]] = {}


def extractor(name: str):
    """Decorator: register an extractor under `name`."""
    return EXTRACTORS.register(name)
