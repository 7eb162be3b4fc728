"""Extraction, splitting, caching and manifests.

Two cache layers under `<cache dir>/scenarios/`, both keyed by sha256 of a recipe and the
source bytes, so a changed recipe or changed data rebuilds only what it affects:

  sources/<source key>.jsonl            one source's cleaned documents
  splits/<scenario>/<scenario key>/     {train,dev,test}.jsonl + manifest-{split}.json

source key   = sha256(extractor version, the source spec, document limits, [(file, sha256)])
scenario key = sha256(scenario recipe, source keys)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from drift_cli.atomic import atomic_write_bytes as write_atomic, cache_dir
from drift_cli.scenarios.cleaning import content_sha256, normalise_text, normalised_sha256, truncate_at_line
from drift_cli.scenarios.document import Document
from drift_cli.scenarios.extractors import MissingSource, list_files, missing_source
from drift_cli.scenarios.source import EXTRACTORS
from drift_cli.scenarios.schema import SPLITS, Scenario, SplitRule
from drift_cli.scenarios.source import SourceSpec

# Bump when extractor or cleaning code changes what the same bytes produce.
EXTRACTION_VERSION = 3


def cache_root() -> Path:
    return cache_dir("scenarios")


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_key(obj) -> str:
    return _sha256_hex(json.dumps(obj, sort_keys=True, default=str).encode())


# ---- source files ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FileRecord:
    path: str
    bytes: int
    sha256: str


_HASH_MEMO: dict[tuple[str, int, int], str] = {}


def file_record(path: Path) -> FileRecord:
    """sha256 of the file's bytes, memoised per (path, size, mtime) within the process."""
    st = path.stat()
    memo = (path.as_posix(), st.st_size, st.st_mtime_ns)
    digest = _HASH_MEMO.get(memo)
    if digest is None:
        digest = _sha256_hex(path.read_bytes())
        _HASH_MEMO[memo] = digest
    return FileRecord(path.as_posix(), st.st_size, digest)


# ---- one source --------------------------------------------------------------------------------

@dataclass
class SourceBuild:
    spec: SourceSpec
    key: str
    files: list[FileRecord]
    documents: list[Document]
    built: bool                    # False when read from the cache


def source_key(scenario: Scenario, spec: SourceSpec, files: list[FileRecord]) -> str:
    return _json_key({
        "extraction_version": EXTRACTION_VERSION,
        "spec": asdict(spec),
        "min_doc_chars": scenario.min_doc_chars,
        "max_doc_chars": scenario.max_doc_chars,
        "salt": scenario.split.salt,
        "cutoff": scenario.split.cutoff,
        "files": [(f.path, f.sha256) for f in files],
    })


def _hash_order(salt: str, doc_id: str) -> int:
    """A salted sha256 of the id as an integer: the deterministic 'shuffle' used everywhere."""
    return int.from_bytes(hashlib.sha256(f"{salt}\x00{doc_id}".encode()).digest()[:8], "big")


def _within_budget(docs: list[Document], max_bytes: int, salt: str) -> list[Document]:
    """The documents kept under a byte budget: taken in hash order, so the subset is a stable
    pseudo-random sample that does not depend on file order."""
    if not max_bytes:
        return docs
    kept, total = [], 0
    for d in sorted(docs, key=lambda d: _hash_order(salt + "/budget", d.id)):
        size = len(d.text.encode())
        if total + size > max_bytes:
            continue
        kept.append(d)
        total += size
    return sorted(kept, key=lambda d: d.id)


def relative_locator(spec: SourceSpec, locator: str) -> str:
    """The locator with the source root removed, so ids (and with them the split) do not
    depend on where the files live: 'json/decoder.py', not '/usr/lib/python3.11/json/decoder.py'."""
    root = Path(spec.root).expanduser().as_posix().rstrip("/")
    if Path(root).is_file():
        parent = root.rsplit("/", 1)[0]
        return locator[len(parent) + 1:] if locator.startswith(parent + "/") else locator
    return locator[len(root) + 1:] if locator.startswith(root + "/") else locator


def extract_documents(scenario: Scenario, spec: SourceSpec, files: list[Path]) -> list[Document]:
    if scenario.split.cutoff:   # dated extractors keep documents on one side of the cutoff
        spec = replace(spec, options=tuple(sorted({**dict(spec.options), "cutoff": scenario.split.cutoff}.items())))
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for raw in EXTRACTORS[spec.extractor](spec, files):
        text = truncate_at_line(normalise_text(raw.text), scenario.max_doc_chars)
        if len(text) < scenario.min_doc_chars:
            continue
        domain = raw.domain or spec.domain
        doc_id = f"{domain}:{spec.id}/{relative_locator(spec, raw.locator)}"
        seen[doc_id] = seen.get(doc_id, 0) + 1
        if seen[doc_id] > 1:
            doc_id = f"{doc_id}~{seen[doc_id]}"
        docs.append(Document(doc_id, text, domain, raw.file, raw.date))
    docs.sort(key=lambda d: d.id)
    return _within_budget(docs, spec.max_bytes, scenario.split.salt)


def _read_jsonl(path: Path) -> list[Document]:
    with open(path, encoding="utf-8") as fh:
        return [Document.from_json(json.loads(line)) for line in fh if line.strip()]


def _jsonl_bytes(docs: list[Document]) -> bytes:
    return "".join(json.dumps(d.to_json(), ensure_ascii=False, sort_keys=True) + "\n" for d in docs).encode()


def _source_files(scenario: Scenario, spec: SourceSpec) -> tuple[list[Path], list[FileRecord]]:
    if spec.extractor == "hf_dataset" and spec.option("name"):
        # a dataset on the hub has no local bytes to hash: it is keyed by name, config and
        # revision (pin `revision` for a reproducible split)
        pin = f"{spec.option('config')}@{spec.option('revision')}"
        return [], [FileRecord(f"hf://{spec.option('name')}", 0, pin)]
    paths = list_files(spec)
    if not paths:
        raise missing_source(scenario.name, spec)
    return paths, [file_record(p) for p in paths]


def build_source(scenario: Scenario, spec: SourceSpec, force: bool = False) -> SourceBuild:
    paths, files = _source_files(scenario, spec)
    key = source_key(scenario, spec, files)
    cached = cache_root() / "sources" / f"{key}.jsonl"
    if cached.exists() and not force:
        return SourceBuild(spec, key, files, _read_jsonl(cached), built=False)
    docs = extract_documents(scenario, spec, paths)
    write_atomic(cached, _jsonl_bytes(docs))
    return SourceBuild(spec, key, files, docs, built=True)


# ---- splitting ----------------------------------------------------------------------------------

def assign_split(doc: Document, rule: SplitRule) -> str:
    """train/dev/test from a salted hash of the document id; with a cutoff, documents dated
    before it are history and always train."""
    if rule.cutoff and doc.date and doc.date < rule.cutoff:
        return "train"
    u = _hash_order(rule.salt, doc.id) / 2.0**64
    if u < rule.train:
        return "train"
    return "dev" if u < rule.train + rule.dev else "test"


def deduplicate(docs: list[Document]) -> list[Document]:
    """Drop documents whose whitespace-normalised text equals an earlier one's (by id order):
    identical copyright files and changelogs shipped by several binary packages, for example."""
    seen: set[str] = set()
    out = []
    for d in sorted(docs, key=lambda d: d.id):
        h = normalised_sha256(d.text)
        if h not in seen:
            seen.add(h)
            out.append(d)
    return out


def split_documents(docs: list[Document], rule: SplitRule) -> dict[str, list[Document]]:
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    for d in deduplicate(docs):
        out[assign_split(d, rule)].append(d)
    return out


# ---- manifests ---------------------------------------------------------------------------------

def split_manifest(scenario: Scenario, key: str, split: str, docs: list[Document],
                   sources: list[SourceBuild], payload: bytes) -> dict:
    """Per split: which files contributed, their licence, bytes, sha256 and document counts."""
    by_file: dict[str, int] = {}
    for d in docs:
        by_file[d.source] = by_file.get(d.source, 0) + 1
    entries = []
    for sb in sources:
        own = sum(1 for d in docs if d.id.split(":", 1)[1].split("/", 1)[0] == sb.spec.id)
        # documents map to files, except for a dataset directory (all its files are listed)
        per_file = any(f.path in by_file for f in sb.files)
        files = [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256, "documents": by_file.get(f.path, 0)}
                 for f in sb.files if f.path in by_file or not per_file]
        entries.append({"id": sb.spec.id, "package": sb.spec.package, "licence": sb.spec.licence,
                        "extractor": sb.spec.extractor, "root": sb.spec.root, "source_key": sb.key,
                        "documents": own, "files": files})
    return {
        "scenario": scenario.name, "version": scenario.version, "split": split,
        "scenario_key": key, "recipe_sha256": scenario.recipe_sha256(),
        "documents": len(docs), "text_bytes": sum(len(d.text.encode()) for d in docs),
        "sha256": _sha256_hex(payload), "sources": entries,
    }


# ---- one scenario ------------------------------------------------------------------------------

@dataclass
class ScenarioBuild:
    scenario: Scenario
    key: str
    splits: dict[str, list[Document]]
    manifests: dict[str, dict]
    built: bool                                 # the split files were (re)written
    sources_built: list[str] = field(default_factory=list)   # source ids extracted afresh
    directory: Path | None = None
    snapshot: bool = False                      # read from the cache while a source is missing


# recipe sha256 -> build, for the life of the process (source files are assumed not to change
# under a running benchmark; forget_loaded() drops it)
_LOADED: dict[str, ScenarioBuild] = {}


def build_scenario(scenario: Scenario, force: bool = False,
                   on_source: Callable[[SourceBuild], None] | None = None) -> ScenarioBuild:
    """Extract (or read from the cache) every source, split, and write splits + manifests.
    `on_source` is called after each source (progress bars)."""
    memo = scenario.recipe_sha256()
    if not force and memo in _LOADED:      # loaded earlier in this process
        return _LOADED[memo]
    if not force and os.environ.get("DRIFT_DATA_SNAPSHOT") == "1":
        # pinned: use the cached build of this recipe even if this machine's files differ
        # (a GPU box whose /usr/share/doc holds other packages); build only if there is none
        snapshot = latest_build(scenario)
        if snapshot is not None:
            _LOADED[memo] = snapshot
            return snapshot
    try:
        sources = []
        for spec in scenario.sources:
            sources.append(build_source(scenario, spec, force))
            if on_source:
                on_source(sources[-1])
    except MissingSource:
        snapshot = None if force else latest_build(scenario)
        if snapshot is None:
            raise
        _LOADED[memo] = snapshot
        return snapshot
    key = _json_key({"recipe": scenario.recipe(), "sources": [s.key for s in sources]})
    directory = cache_root() / "splits" / scenario.name / key
    fresh = [s.spec.id for s in sources if s.built]
    cached = None if force else _read_build(directory)
    if cached is not None:
        result = ScenarioBuild(scenario, key, *cached, built=False, sources_built=fresh, directory=directory)
    else:
        splits = split_documents([d for s in sources for d in s.documents], scenario.split)
        manifests = _write_build(directory, scenario, key, splits, sources)
        result = ScenarioBuild(scenario, key, splits, manifests, built=True, sources_built=fresh, directory=directory)
    _record_latest(directory, memo, key)
    _LOADED[memo] = result
    return result


_BUILD_FILES = [f"{s}.jsonl" for s in SPLITS] + [f"manifest-{s}.json" for s in SPLITS]


def _read_build(directory: Path) -> tuple[dict, dict] | None:
    """(splits, manifests) of a complete build directory, else None."""
    if not all((directory / n).exists() for n in _BUILD_FILES):
        return None
    splits = {s: _read_jsonl(directory / f"{s}.jsonl") for s in SPLITS}
    manifests = {s: json.loads((directory / f"manifest-{s}.json").read_text()) for s in SPLITS}
    return splits, manifests


def _write_build(directory: Path, scenario: Scenario, key: str, splits: dict[str, list[Document]],
                 sources: list[SourceBuild]) -> dict[str, dict]:
    manifests = {}
    for split, docs in splits.items():
        payload = _jsonl_bytes(docs)
        write_atomic(directory / f"{split}.jsonl", payload)
        manifests[split] = split_manifest(scenario, key, split, docs, sources, payload)
    for split, manifest in manifests.items():   # manifests last: they mark a complete build
        write_atomic(directory / f"manifest-{split}.json",
                     (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifests


def _record_latest(directory: Path, recipe_sha256: str, key: str) -> None:
    latest = {"recipe_sha256": recipe_sha256, "key": key}
    path = directory.parent / "latest.json"
    if not path.exists() or json.loads(path.read_text()) != latest:
        write_atomic(path, (json.dumps(latest, sort_keys=True) + "\n").encode())


def latest_build(scenario: Scenario) -> ScenarioBuild | None:
    """The last build of this exact recipe (`snapshot`), for a machine without the OS packages
    or with different files (see DRIFT_DATA_SNAPSHOT); None if absent or not intact."""
    latest_path = cache_root() / "splits" / scenario.name / "latest.json"
    if not latest_path.exists():
        return None
    latest = json.loads(latest_path.read_text())
    directory = latest_path.parent / latest["key"]
    cached = _read_build(directory) if latest["recipe_sha256"] == scenario.recipe_sha256() else None
    if cached is None:
        return None
    splits, manifests = cached
    for s, m in manifests.items():   # the snapshot must be the bytes its manifest describes
        if _sha256_hex(_jsonl_bytes(splits[s])) != m["sha256"]:
            return None
    return ScenarioBuild(scenario, latest["key"], splits, manifests, built=False, directory=directory, snapshot=True)


def forget_loaded() -> None:
    """Drop the in-process cache of loaded splits (tests; long-running processes)."""
    _LOADED.clear()
    _HASH_MEMO.clear()


def text_fingerprint(docs: list[Document]) -> str:
    return content_sha256("\n".join(d.id + "\x00" + d.text for d in docs))


def cached_manifests(scenario: Scenario) -> dict[str, dict] | None:
    """The manifests of the current build if it is in the cache, else None (nothing is
    extracted; source files are listed and hashed to find the key). BadInput if a source is
    missing."""
    keys = [source_key(scenario, spec, _source_files(scenario, spec)[1]) for spec in scenario.sources]
    key = _json_key({"recipe": scenario.recipe(), "sources": keys})
    directory = cache_root() / "splits" / scenario.name / key
    files = [directory / f"manifest-{s}.json" for s in SPLITS]
    if not all(f.exists() for f in files):
        return None
    return {s: json.loads(f.read_text()) for s, f in zip(SPLITS, files)}


def prune_cache() -> list[Path]:
    """Delete superseded builds: split directories other than each scenario's latest, and
    extracted sources no latest build uses. Returns what was removed."""
    import shutil

    root = cache_root()
    keep_sources: set[str] = set()
    removed: list[Path] = []
    for latest_path in sorted((root / "splits").glob("*/latest.json")):
        key = json.loads(latest_path.read_text())["key"]
        manifest = latest_path.parent / key / "manifest-train.json"
        if manifest.exists():
            keep_sources.update(s["source_key"] for s in json.loads(manifest.read_text())["sources"])
        for d in sorted(latest_path.parent.iterdir()):
            if d.is_dir() and d.name != key:
                shutil.rmtree(d)
                removed.append(d)
    for f in sorted((root / "sources").glob("*.jsonl")):
        if f.stem not in keep_sources:
            f.unlink()
            removed.append(f)
    _LOADED.clear()
    return removed
