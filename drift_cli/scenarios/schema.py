"""The scenario schema, defined once: TOML file + shared defaults -> a validated `Scenario`.

A scenario file is data only (no code): its sources (what to extract, from which OS package,
under which licence), the split rule and the stream shape. `scenarios/defaults.toml` holds the
shared values; a scenario's tables are merged over it key by key. Every validation failure is a
`BadInput` that names the file and the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drift_cli.errors import BadInput
from drift_cli.registry import suggest
from drift_cli.scenarios.source import EXTRACTORS, SourceSpec

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser as a package ("tomli; python_version < '3.11'")
    import tomli as tomllib

SPLITS = ("train", "dev", "test")
STREAM_ORDERS = ("shuffle", "interleave", "block", "mixture")
DRAFT_ROLES = ("none", "train", "pre_cutoff")


@dataclass(frozen=True)
class SplitRule:
    """Documents go to train/dev/test by a salted sha256 of their id (disjoint by document).

    With `cutoff` set (ISO date), documents dated before it all go to train (history the draft
    may learn from); documents on or after it are hashed into train/dev/test.
    """

    salt: str = "drift-bench/v1"
    train: float = 0.8
    dev: float = 0.1
    test: float = 0.1
    cutoff: str | None = None


@dataclass(frozen=True)
class StreamSpec:
    prompt_tokens: int = 64
    max_new_tokens: int = 128
    prompts: tuple[tuple[str, int], ...] = (("train", 40), ("dev", 20), ("test", 40))
    order: str = "shuffle"          # shuffle | interleave (round-robin over domains) | block | mixture
    block_prompts: int = 2          # block order: consecutive prompts per domain
    variants: tuple[str, ...] = ()  # other orders this scenario offers (build_stream variant=)
    tenants: str = "none"           # none | domain (tenant id = the prompt's domain)
    windows_per_doc: int = 4        # at most this many prompt windows cut from one document

    def prompts_for(self, split: str) -> int:
        return dict(self.prompts)[split]


@dataclass(frozen=True)
class Scenario:
    name: str
    version: int
    description: str
    domain: str
    path: str                       # the TOML file ("" for ad-hoc corpora)
    sources: tuple[SourceSpec, ...] = ()
    components: tuple[str, ...] = ()  # mixed scenarios: documents come from these scenarios
    split: SplitRule = field(default_factory=SplitRule)
    stream: StreamSpec = field(default_factory=StreamSpec)
    draft_data: str = "none"        # none | train | pre_cutoff: what the zoo's draft may see
    min_doc_chars: int = 400        # shorter cleaned documents are dropped
    max_doc_chars: int = 20000      # longer ones are truncated at a line break

    def recipe(self) -> dict:
        """Everything that determines the extracted splits (hashed into cache keys)."""
        d = asdict(self)
        d.pop("path")
        d.pop("stream")             # the stream shape does not change the splits
        d.pop("description")
        return d

    def recipe_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.recipe(), sort_keys=True, default=str).encode()).hexdigest()


# ---- loading and validation -------------------------------------------------------------------

_TOP = {"name", "version", "description", "domain", "sources", "components", "split", "stream",
        "draft_data", "min_doc_chars", "max_doc_chars"}
_SOURCE = {"id", "extractor", "package", "licence", "root", "include", "exclude", "domain",
           "max_bytes", "options"}
_SPLIT = {"salt", "train", "dev", "test", "cutoff"}
_STREAM = {"prompt_tokens", "max_new_tokens", "prompts", "order", "block_prompts", "variants",
           "tenants", "windows_per_doc"}


class _Fields:
    """Typed reads from one TOML table; errors name the file and the dotted field."""

    def __init__(self, file: str, prefix: str, table: dict, allowed: set[str]) -> None:
        self.file, self.prefix, self.table = file, prefix, table
        for key in table:
            if key not in allowed:
                self.fail(key, f"unknown field{suggest(key, allowed)}")

    def fail(self, key: str, why: str) -> BadInput:
        raise BadInput(f"{self.file}: field '{self.prefix}{key}': {why}")

    def get(self, key: str, kind: type | tuple, default: Any = ..., check=None) -> Any:
        if key not in self.table:
            if default is ...:
                self.fail(key, "missing")
            return default
        value = self.table[key]
        ok = isinstance(value, kind) and not (kind in (int, float, (int, float)) and isinstance(value, bool))
        if not ok:
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(key, f"expected {names}, got {type(value).__name__} {value!r}")
        if check is not None:
            why = check(value)
            if why:
                self.fail(key, why)
        return value


def _positive(v) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _one_of(choices):
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}{suggest(v, choices)}"


def _iso_date(v) -> str | None:
    import datetime as dt

    try:
        dt.date.fromisoformat(v)
    except ValueError:
        return "must be an ISO date (YYYY-MM-DD)"
    return None


def _str_list(f: _Fields, key: str, default: tuple = ()) -> tuple[str, ...]:
    value = f.get(key, list, list(default))
    if not all(isinstance(x, str) for x in value):
        f.fail(key, "expected a list of strings")
    return tuple(value)


def merge_tables(base: dict, over: dict) -> dict:
    """Deep merge: tables merge key by key, everything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = value
    return out


def parse_source(file: str, index: int, table: dict, scenario_domain: str) -> SourceSpec:
    f = _Fields(file, f"sources[{index}].", table, _SOURCE)
    options = f.get("options", dict, {})
    return SourceSpec(
        id=f.get("id", str, check=lambda v: None if v and ":" not in v else "must be non-empty, no ':'"),
        extractor=f.get("extractor", str, check=_one_of(sorted(EXTRACTORS.names()))),
        package=f.get("package", str, ""),
        licence=f.get("licence", str),
        root=f.get("root", str, check=lambda v: None if v else "must be non-empty"),
        include=_str_list(f, "include", ("**/*",)),
        exclude=_str_list(f, "exclude"),
        domain=f.get("domain", str, scenario_domain),
        max_bytes=f.get("max_bytes", int, 0, _non_negative),
        options=tuple(sorted(options.items())),
    )


def parse_split(file: str, table: dict) -> SplitRule:
    f = _Fields(file, "split.", table, _SPLIT)
    frac = lambda v: None if 0 <= v <= 1 else "must be within [0, 1]"  # noqa: E731
    rule = SplitRule(
        salt=f.get("salt", str, SplitRule.salt),
        train=float(f.get("train", (int, float), SplitRule.train, frac)),
        dev=float(f.get("dev", (int, float), SplitRule.dev, frac)),
        test=float(f.get("test", (int, float), SplitRule.test, frac)),
        cutoff=f.get("cutoff", str, None, _iso_date),
    )
    if abs(rule.train + rule.dev + rule.test - 1.0) > 1e-9:
        f.fail("train", f"train + dev + test must be 1, got {rule.train + rule.dev + rule.test:g}")
    return rule


def parse_stream(file: str, table: dict) -> StreamSpec:
    f = _Fields(file, "stream.", table, _STREAM)
    prompts = {**dict(StreamSpec.prompts), **f.get("prompts", dict, {})}
    for split in SPLITS:
        n = prompts.get(split)
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            f.fail("prompts", f"'{split}' must be a positive integer, got {n!r}")
    for key in prompts:
        if key not in SPLITS:
            f.fail("prompts", f"unknown split '{key}'{suggest(key, SPLITS)}")
    variants = _str_list(f, "variants")
    for v in variants:
        if v not in STREAM_ORDERS:
            f.fail("variants", f"unknown order '{v}'{suggest(v, STREAM_ORDERS)}")
    return StreamSpec(
        prompt_tokens=f.get("prompt_tokens", int, StreamSpec.prompt_tokens, _positive),
        max_new_tokens=f.get("max_new_tokens", int, StreamSpec.max_new_tokens, _positive),
        prompts=tuple((s, prompts[s]) for s in SPLITS),
        order=f.get("order", str, StreamSpec.order, _one_of(STREAM_ORDERS)),
        block_prompts=f.get("block_prompts", int, StreamSpec.block_prompts, _positive),
        variants=variants,
        tenants=f.get("tenants", str, StreamSpec.tenants, _one_of(("none", "domain"))),
        windows_per_doc=f.get("windows_per_doc", int, StreamSpec.windows_per_doc, _positive),
    )


def parse_scenario(file: str, table: dict, name: str) -> Scenario:
    f = _Fields(file, "", table, _TOP)
    domain = f.get("domain", str, name)
    sources_raw = f.get("sources", list, [])
    components = _str_list(f, "components")
    if not sources_raw and not components:
        f.fail("sources", "a scenario needs sources (or components for a mixed scenario)")
    sources = []
    for i, s in enumerate(sources_raw):
        if not isinstance(s, dict):
            f.fail("sources", f"entry {i} must be a table")
        sources.append(parse_source(file, i, s, domain))
    ids = [s.id for s in sources]
    if len(set(ids)) != len(ids):
        f.fail("sources", f"duplicate source ids in {ids}")
    scenario = Scenario(
        name=f.get("name", str, name),
        version=f.get("version", int, check=_positive),
        description=f.get("description", str),
        domain=domain,
        path=file,
        sources=tuple(sources),
        components=components,
        split=parse_split(file, f.get("split", dict, {})),
        stream=parse_stream(file, f.get("stream", dict, {})),
        draft_data=f.get("draft_data", str, "none", _one_of(DRAFT_ROLES)),
        min_doc_chars=f.get("min_doc_chars", int, 400, _non_negative),
        max_doc_chars=f.get("max_doc_chars", int, 20000, _positive),
    )
    if scenario.draft_data == "pre_cutoff" and scenario.split.cutoff is None:
        f.fail("draft_data", "'pre_cutoff' needs split.cutoff")
    return scenario


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None


def load_scenario_file(path: Path, defaults: dict | None = None) -> Scenario:
    table = read_toml(path)
    if defaults:
        table = merge_tables(defaults, table)
    return parse_scenario(str(path), table, path.stem)
