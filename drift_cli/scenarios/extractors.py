"""Corpus extractors: files from one source -> raw documents.

Each extractor takes the source spec and its sorted file list and yields `RawDoc`s in a
deterministic order. Entry-shaped sources (dictionaries, fortune cookies, lexicon entries,
changelog entries) are grouped into documents of about `chunk_chars` characters, so that a
document is long enough to cut prompt windows from; the split stays disjoint by document.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import fnmatch
import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from drift_cli.errors import BadInput
from drift_cli.scenarios.cleaning import clean_gcide, gcide_quotations, normalise_text, troff_to_text
from drift_cli.scenarios.source import FILE_FILTERS, RawDoc, SourceSpec, extractor


# ---- files -------------------------------------------------------------------------------------

def list_files(spec: SourceSpec) -> list[Path]:
    """Sorted files under spec.root matching include and not exclude (relative posix globs)."""
    root = Path(spec.root).expanduser()
    if root.is_file():
        return [root]
    if not root.is_dir():
        return []
    found: set[Path] = set()
    for pattern in spec.include:
        found.update(p for p in root.glob(pattern) if p.is_file())
    keep = []
    for p in found:
        rel = p.relative_to(root).as_posix()
        if not any(fnmatch.fnmatchcase(rel, pat) for pat in spec.exclude):
            keep.append(p)
    keep.sort(key=lambda p: p.as_posix())
    select = FILE_FILTERS.get(spec.extractor)
    return select(spec, root, keep) if select else keep


class MissingSource(BadInput):
    """A scenario's source files are not on this machine (names the OS package)."""


def missing_source(scenario: str, spec: SourceSpec) -> MissingSource:
    where = f"{spec.root} ({', '.join(spec.include)})"
    if spec.package:
        return MissingSource(f"scenario '{scenario}': source '{spec.id}' not found at {where}; "
                        f"it is provided by the OS package '{spec.package}' "
                        f"(apt-get install {spec.package}, or run scripts/install-data-deps.sh)")
    return MissingSource(f"scenario '{scenario}': source '{spec.id}' not found at {where}")


class UnreadableFile(BadInput):
    """A source file that cannot be read, decompressed or decoded (the message names it)."""


def read_bytes(path: Path) -> bytes:
    """The bytes of a file, gunzipped when it starts with gzip's magic bytes."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UnreadableFile(f"{path}: cannot read it: {e.strerror or e}") from None
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:   # BadGzipFile is an OSError; a truncated stream, EOFError
        raise UnreadableFile(f"{path}: starts with gzip's magic bytes but is not a valid gzip stream "
                             f"({e or type(e).__name__})") from None


def read_text(path: Path, strict: bool = False) -> str | None:
    """UTF-8 text of a (possibly gzipped) file, or None for a binary file (a NUL in its first 4 KiB).

    A file that cannot be read, gunzipped or decoded as UTF-8 is None too (skipped, as in the
    OS packages' sources), or with `strict` (the user's own files) an `UnreadableFile`.
    """
    try:
        data = read_bytes(path)
    except UnreadableFile:
        if strict:
            raise
        return None
    if b"\x00" in data[:4096]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if strict:
            raise UnreadableFile(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        return None


def chunk_entries(entries: Iterable[tuple[str, str]], chunk_chars: int, file: str,
                  date: str | None = None) -> Iterator[RawDoc]:
    """Group consecutive (key, text) entries into documents of at least chunk_chars."""
    buf: list[str] = []
    first = ""
    size = 0
    for key, text in entries:
        if not buf:
            first = key
        buf.append(text)
        size += len(text)
        if size >= chunk_chars:
            yield RawDoc(f"{file}@{first}", "\n\n".join(buf), file, date)
            buf, size = [], 0
    if buf:
        yield RawDoc(f"{file}@{first}", "\n\n".join(buf), file, date)


# ---- extractors ---------------------------------------------------------------------------------

@extractor("text_files")
def text_files(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """One document per text file (gzip is read transparently; binary files are skipped)."""
    for path in files:
        text = read_text(path)
        if text is not None:
            yield RawDoc(path.as_posix(), text, path.as_posix())


@extractor("python_source")
def python_source(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """One document per Python module, as written (comments and docstrings included)."""
    for path in files:
        text = read_text(path)
        if text is not None and text.strip():
            yield RawDoc(path.as_posix(), text, path.as_posix())


_CHANGELOG_HEAD = re.compile(r"^([a-z0-9][a-z0-9+.\-]*) \(([^)\s]+)\) [^;]*;.*$")
_CHANGELOG_TRAILER = re.compile(r"^ -- (.+?)  ?(\w{3}, .+)$")
_LONG_DATE = re.compile(r"(\d{1,2})\s+([A-Za-z]+)\s+(\d{4})")


def _trailer_date(stamp: str) -> dt.date | None:
    try:
        return email.utils.parsedate_to_datetime(stamp.strip()).date()
    except (TypeError, ValueError, IndexError):
        m = _LONG_DATE.search(stamp)
        if not m:
            return None
        try:
            return dt.datetime.strptime(" ".join(m.groups()), "%d %B %Y").date()
        except ValueError:
            return None


def changelog_entries(text: str) -> Iterator[tuple[str, str, str, dt.date]]:
    """(source package, version, entry text, date) for each dated entry of a Debian changelog."""
    lines: list[str] = []
    head = None
    for line in text.split("\n"):
        m = _CHANGELOG_HEAD.match(line)
        if m:
            head, lines = m, [line]
            continue
        if head is None:
            continue
        lines.append(line)
        t = _CHANGELOG_TRAILER.match(line)
        if t:
            date = _trailer_date(t.group(2))
            if date is not None:
                yield head.group(1), head.group(2), "\n".join(lines), date
            head, lines = None, []


@extractor("debian_changelog")
def debian_changelog(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """Debian changelog entries, deduplicated by (source package, version), grouped per source
    package and calendar year into dated documents (date = the group's newest entry).

    With options.cutoff, a year that straddles the cutoff is split into two documents, so a
    document is never partly before and partly after it.
    """
    cutoff = spec.option("cutoff")
    cut = dt.date.fromisoformat(cutoff) if cutoff else None
    seen: set[tuple[str, str]] = set()
    groups: dict[tuple[str, int, bool], list[tuple[dt.date, str, str]]] = {}
    for path in files:
        text = read_text(path)
        if text is None:
            continue
        for source, version, entry, date in changelog_entries(text):
            if (source, version) in seen:
                continue
            seen.add((source, version))
            after = cut is not None and date >= cut
            groups.setdefault((source, date.year, after), []).append((date, entry, path.as_posix()))
    for (source, year, after), items in sorted(groups.items()):
        items.sort(key=lambda x: (x[0], x[1]), reverse=True)   # newest first, like a changelog
        newest = items[0][0].isoformat()
        text = "\n\n".join(entry for _, entry, _ in items)
        tag = "post" if after else "pre"
        yield RawDoc(f"{source}/{year}{'' if cut is None else '-' + tag}", text, items[0][2], newest)


def _dictd_offset(b64: str) -> int:
    # dictd indexes write numbers in base64 digits, most significant first
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for ch in b64:
        n = n * 64 + alphabet.index(ch)
    return n


def dictd_entries(index: Path, data: Path) -> Iterator[tuple[str, str]]:
    """(headword, entry text) for each distinct entry of a dictd dictionary, in file order."""
    raw = read_bytes(data)
    spans: dict[tuple[int, int], str] = {}
    for line in index.read_text(encoding="utf-8", errors="replace").split("\n"):
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        span = (_dictd_offset(parts[1]), _dictd_offset(parts[2]))
        spans.setdefault(span, parts[0])
    for (start, length), word in sorted(spans.items()):
        piece = raw[start:start + length]
        try:
            yield word, piece.decode("utf-8")
        except UnicodeDecodeError:   # a few GCIDE entries carry stray cp1252 bytes (0x92: ’)
            yield word, piece.decode("cp1252", errors="replace")


@extractor("dictd")
def dictd(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """Entries of a dictd dictionary (FOLDOC, GCIDE, the Jargon File in dict form).

    options: include (regexes; keep an entry if any matches), exclude (drop if any matches),
    clean ("gcide" strips source tags and pronunciations), chunk_chars,
    part ("entries", the default, or "quotations": only the literary quotations an entry cites).
    """
    include = [re.compile(p) for p in spec.option("include", [])]
    exclude = [re.compile(p) for p in spec.option("exclude", [])]
    clean = clean_gcide if spec.option("clean") == "gcide" else (lambda s: s)
    chunk = int(spec.option("chunk_chars", 2000))
    quotations = spec.option("part", "entries") == "quotations"
    pairs = {}
    for f in files:
        stem = f.name.split(".")[0]
        pairs.setdefault(stem, {})["index" if f.name.endswith(".index") else "data"] = f
    for stem, pair in sorted(pairs.items()):
        if set(pair) != {"index", "data"}:
            continue

        def keep(entries):
            for word, text in entries:
                if include and not any(p.search(text) for p in include):
                    continue
                if any(p.search(text) for p in exclude):
                    continue
                if quotations:
                    for i, quote in enumerate(gcide_quotations(text)):
                        yield f"{word}#{i}", normalise_text(quote)
                else:
                    yield word, normalise_text(clean(text))

        yield from chunk_entries(keep(dictd_entries(pair["index"], pair["data"])), chunk,
                                 pair["data"].as_posix())


_JARGON_ENTRY = re.compile(r"^   :([^:\n]+):", re.MULTILINE)


@extractor("jargon_file")
def jargon_file(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """The Jargon File's lexicon (entries start with '   :headword:'), grouped into chunks."""
    chunk = int(spec.option("chunk_chars", 2000))
    for path in files:
        text = read_text(path) or ""
        starts = [m.start() for m in _JARGON_ENTRY.finditer(text)]
        entries = []
        for a, b in zip(starts, starts[1:] + [len(text)]):
            body = text[a:b]
            entries.append((_JARGON_ENTRY.match(body).group(1), normalise_text(body)))
        yield from chunk_entries(entries, chunk, path.as_posix())


@extractor("fortunes")
def fortunes(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """fortune(6) cookie files ('%' separated), consecutive cookies grouped into chunks."""
    chunk = int(spec.option("chunk_chars", 2000))
    for path in files:
        text = read_text(path)
        if text is None:
            continue
        cookies = [normalise_text(c) for c in re.split(r"\n%\n", "\n" + text + "\n")]
        entries = [(f"{i:05d}", c) for i, c in enumerate(cookies) if c]
        yield from chunk_entries(entries, chunk, path.as_posix())


def _man_language(rel: str) -> str:
    first = rel.split("/", 1)[0]
    return "en" if first.startswith("man") else first


def _translated_pages_only(spec: SourceSpec, root: Path, files: list[Path]) -> list[Path]:
    """options.english = "translated_only": keep an English page only when a translation of
    the same page is among the files (so the languages cover the same commands)."""
    if spec.option("english") != "translated_only":
        return files
    langs = {p: _man_language(p.relative_to(root).as_posix()) for p in files}
    translated = {p.name for p, lang in langs.items() if lang != "en"}
    return [p for p in files if langs[p] != "en" or p.name in translated]


@extractor("manpages")
def manpages(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """Manual pages (troff -> text). Domain = '<source domain>.<language>' ('en' for the
    untranslated tree)."""
    root = Path(spec.root)
    for path in files:
        lang = _man_language(path.relative_to(root).as_posix())
        src = read_text(path)
        if src is None or src.lstrip().startswith(".so "):
            continue   # binary, or a redirect to another page
        yield RawDoc(path.as_posix(), troff_to_text(src), path.as_posix(), None, f"{spec.domain}.{lang}")


FILE_FILTERS["manpages"] = _translated_pages_only


@extractor("jsonl")
def jsonl(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """JSON Lines with a text field (options.text_field, default "text"); optional id field."""
    field_name = spec.option("text_field", "text")
    id_field = spec.option("id_field")
    for path in files:
        for n, line in enumerate((read_text(path, strict=True) or "").split("\n"), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(f"{path}:{n}: not valid JSON: {e.msg}") from None
            if not isinstance(record, dict) or not isinstance(record.get(field_name), str):
                raise BadInput(f"{path}:{n}: no string field '{field_name}'")
            key = str(record[id_field]) if id_field and id_field in record else f"{n:07d}"
            yield RawDoc(f"{path.as_posix()}#{key}", record[field_name], path.as_posix(),
                         record.get("date") if isinstance(record.get("date"), str) else None)


def load_hf_dataset(spec: SourceSpec, files: list[Path]):
    """The `datasets.Dataset` a source names: options.name (from the hub: needs network),
    options.builder (e.g. "json") over the source files, or a `save_to_disk` directory (root)."""
    try:
        import datasets
    except ImportError:
        raise BadInput(f"source '{spec.id}' needs the Python package 'datasets' "
                       "(pip install datasets)") from None
    split = spec.option("split", "train")
    name, builder = spec.option("name"), spec.option("builder")
    try:
        if name:
            return datasets.load_dataset(name, spec.option("config"), split=split,
                                         revision=spec.option("revision"))
        if builder:
            return datasets.load_dataset(builder, data_files=[str(f) for f in files], split=split)
        ds = datasets.load_from_disk(spec.root)
        return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
    except (OSError, ValueError, KeyError, ConnectionError) as e:
        what = f"Hugging Face dataset '{name}'" if name else f"dataset at {spec.root}"
        raise BadInput(f"source '{spec.id}': cannot load {what}: {str(e).splitlines()[0][:200]}") from None


@extractor("hf_dataset")
def hf_dataset(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """Records of a Hugging Face dataset (see load_hf_dataset); options: split (default
    "train"), text_field (default "text"), chunk_chars (default 2000: consecutive records are
    grouped, since many datasets hold one line or paragraph per record)."""
    ds = load_hf_dataset(spec, files)
    field_name = spec.option("text_field", "text")
    if field_name not in ds.column_names:
        raise BadInput(f"source '{spec.id}': dataset has no column '{field_name}' "
                       f"(columns: {', '.join(ds.column_names)})")
    where = f"hf://{spec.option('name')}" if spec.option("name") else spec.root
    records = ((f"{i:07d}", t) for i, t in enumerate(ds[field_name]) if isinstance(t, str) and t.strip())
    yield from chunk_entries(records, int(spec.option("chunk_chars", 2000)), where)
