"""Name registries with "did you mean" suggestions."""

from __future__ import annotations

import difflib
from typing import Generic, Iterable, TypeVar

from drift_cli.errors import BadInput

T = TypeVar("T")


def suggest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown(kind: str, name: str, choices: Iterable[str]) -> BadInput:
    choices = sorted(choices)
    return BadInput(f"unknown {kind} '{name}'{suggest(name, choices)}; choose from: {', '.join(choices)}")


class Registry(Generic[T]):
    """An ordered name -> object table whose lookups fail with a helpful `BadInput`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str):
        def wrap(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj

        return wrap

    def __getitem__(self, name: str) -> T:
        if name not in self._items:
            raise unknown(self.kind, name, self._items)
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return list(self._items)
