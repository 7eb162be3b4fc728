"""Typed method settings: each knob (flag, help, default, validation) declared once, on a dataclass field.

A method's settings are frozen dataclasses whose fields are made with `knob(...)`. From them:
  * the CLI options of `drift bench` / `ablate` / `analyze` are generated
    (`drift_cli.commands.options.knob_options`; this module does not import click),
  * `from_options` builds an instance from the parsed option values (None = keep the default),
  * `check` validates an instance (one `BadInput` line naming the flag),
  * `parse_value` turns a string (`drift ablate --values`) into a validated field value.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable

from drift_cli.errors import BadInput
from drift_cli.registry import suggest


@dataclass(frozen=True)
class Knob:
    flag: str                                   # "--gain"; its option name is "gain"
    help: str
    kind: type = str                            # float, int, bool, str or Path
    ok: Callable[[Any], bool] | None = None     # the validation, on a value of `kind`
    rule: str = ""                              # what `ok` demands, for the error: "must be >= 0"
    choices: tuple[str, ...] | None = None      # a str knob limited to these
    off_flag: str | None = None                 # bool: the flag that sets False ("--no-adaptive-rate")
    cli: bool = True                            # False: a setting with no flag (set in code only)
    dest: str | None = None                     # the option name when it is not the flag's ("switch_after")
    parse: Callable[[str], Any] | None = None   # text -> value, for a kind that is not one scalar ("1,2,4")
    # Read only when another field of the settings has a value: (field name, value), e.g.
    # --gamma-p-min needs ("policy", "confidence"), or one of several: (field name, (v1, v2));
    # given with another value, the flag is refused.
    needs: tuple[str, Any] | None = None
    selects: str = ""                           # a selector field: what its value picks ("γ controller")

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def needed(self) -> tuple[str, ...]:
        """The values of the `needs` field under which this knob is read."""
        assert self.needs is not None
        wanted = self.needs[1]
        return tuple(wanted) if isinstance(wanted, (tuple, list)) else (wanted,)


def knob(default: Any, flag: str, help: str, kind: type | None = None, ok: Callable[[Any], bool] | None = None,
         rule: str = "", choices: tuple[str, ...] | None = None, off_flag: str | None = None,
         cli: bool = True, dest: str | None = None, parse: Callable[[str], Any] | None = None,
         needs: tuple[str, Any] | None = None, selects: str = "") -> Any:
    """A dataclass field carrying its CLI flag, help text and validation."""
    kind = kind or (type(default) if default is not None else str)
    meta = {"knob": Knob(flag, help, kind, ok, rule, choices, off_flag, cli, dest, parse, needs, selects)}
    return field(default=default, metadata=meta)


def knobs(cls: type) -> list[tuple[Field, Knob]]:
    """(field, knob) of every knob field of a settings dataclass, in declaration order."""
    assert is_dataclass(cls), cls
    return [(f, f.metadata["knob"]) for f in fields(cls) if "knob" in f.metadata]


def default_of(f: Field) -> Any:
    return None if f.default is MISSING else f.default


def from_options(cls: type, options: dict[str, Any]) -> Any:
    """Parsed option values (keyed by option name; None = not given) -> a `cls` instance, unchecked."""
    given = {f.name: options[k.name] for f, k in knobs(cls) if options.get(k.name) is not None}
    return cls(**given)


def problem(k: Knob, value: Any) -> str | None:
    """The error message for a bad value of one knob, or None."""
    if value is None:
        return None
    if k.choices is not None and value not in k.choices:
        return f"{k.flag} must be one of {', '.join(k.choices)}, got {value!r}{suggest(str(value), k.choices)}"
    if k.ok is not None and not k.ok(value):
        return f"{k.flag} {k.rule}, got {value}"
    return None


def check(obj: Any) -> Any:
    """Validate every knob of a settings instance (BadInput naming the first bad flag); returns it."""
    for f, k in knobs(type(obj)):
        message = problem(k, getattr(obj, f.name))
        if message:
            raise BadInput(message)
    return obj


def check_options(classes: list[type], options: dict[str, Any]) -> None:
    """Validate the given option values of these settings classes (before any model loads)."""
    for cls in classes:
        check(from_options(cls, options))


_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def parse_text(k: Knob, text: str) -> Any:
    """A knob value from text (as the CLI would parse it); BadInput when it is not of the knob's kind."""
    text = text.strip()
    if k.parse is not None:
        return k.parse(text)
    try:
        if k.kind is bool:
            low = text.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError(text)
        if k.kind is Path:
            return Path(text)
        return k.kind(text)
    except ValueError:
        raise BadInput(f"{k.flag}: {text!r} is not a valid {k.kind.__name__}") from None


KIND_NAMES = {int: "integer", float: "float", bool: "boolean", str: "string", Path: "path"}


def coerce(k: Knob, value: Any, check: bool = True) -> Any:
    """A value given as data (a suite's TOML) -> the knob's kind, as strictly as the flag parses
    text: no bool for a number, no fraction for an integer, no number for a string; then (check)
    its rule. BadInput (naming the problem, not the place: the caller adds that) otherwise."""
    kind = KIND_NAMES.get(k.kind, k.kind.__name__)
    if value is None:
        return None
    if isinstance(value, str) and k.parse is not None:
        value = k.parse(value)
    elif isinstance(value, str) and k.kind not in (str, Path):
        try:
            value = parse_text(k, value)
        except BadInput:
            raise BadInput(f"{value!r} is not a valid {kind}") from None
    ok_type = {bool: lambda v: isinstance(v, bool),
               int: lambda v: isinstance(v, int) and not isinstance(v, bool),
               float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               str: lambda v: isinstance(v, str), Path: lambda v: isinstance(v, (str, Path))}.get(k.kind)
    if ok_type is not None and not ok_type(value):
        raise BadInput(f"{value!r} is not a valid {kind}")
    try:
        value = float(value) if k.kind is float else Path(value) if k.kind is Path else value
    except OverflowError:
        raise BadInput(f"{value!r} is too large for a float") from None
    message = problem(k, value) if check else None
    if message:
        raise BadInput(message)
    return value


def find(cls: type, name: str) -> tuple[Field, Knob]:
    """The knob of field `name`."""
    for f, k in knobs(cls):
        if f.name == name:
            return f, k
    raise KeyError(name)


def parse_value(cls: type, name: str, text: str) -> Any:
    """Text -> a validated value of field `name` of `cls` (the same checks as the flag's)."""
    _, k = find(cls, name)
    value = parse_text(k, text)
    message = problem(k, value)
    if message:
        raise BadInput(message)
    return value


def with_value(obj: Any, name: str, value: Any) -> Any:
    """A copy of a settings instance with one field replaced."""
    return replace(obj, **{name: value})


class Settings:
    """Base of a settings dataclass: `from_options` and `validate` from its knobs."""

    @classmethod
    def from_options(cls, options: dict[str, Any]):
        """Parsed option values (None = not given, keep the default) -> an instance, unchecked."""
        return from_options(cls, options)

    def validate(self):
        return check(self)


# -- common predicates ----------------------------------------------------------------------

def finite(x: float) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return isinstance(x, int) or math.isfinite(x)


def at_least(lo: float, finite_only: bool = True) -> Callable[[Any], bool]:
    return lambda x: x >= lo and (not finite_only or finite(x))


def between(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda x: lo <= x <= hi
