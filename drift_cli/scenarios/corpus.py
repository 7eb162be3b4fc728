"""Ad-hoc scenarios from the user's own text (`drift bench --corpus PATH`).

A text file, a directory of text files, or a JSONL file with a text field becomes a scenario
with its own train/dev/test split (train for `offline`, dev/test for streams). Text is cut into
documents of about `chunk_chars` characters at paragraph breaks, so a single file still gives
many documents and the split stays disjoint by document.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from drift_cli.errors import BadInput
from drift_cli.scenarios.extractors import UnreadableFile, chunk_entries, jsonl, read_text
from drift_cli.scenarios.source import RawDoc, extractor
from drift_cli.scenarios.schema import Scenario, SplitRule, merge_tables, parse_stream
from drift_cli.scenarios.source import SourceSpec

CORPUS_SPLIT = SplitRule(salt="drift-bench/corpus/v1", train=0.5, dev=0.25, test=0.25)


def paragraphs_to_chunks(text: str, chunk_chars: int) -> list[tuple[int, str]]:
    """(character offset, chunk) pieces of at least chunk_chars, cut at blank lines; a short
    remainder at the end joins the last piece, so no text is dropped."""
    chunks: list[tuple[int, str]] = []
    start, pos, parts = 0, 0, []
    for para in re.split(r"(\n\s*\n)", text):
        if not parts:
            start = pos
        parts.append(para)
        pos += len(para)
        if sum(map(len, parts)) >= chunk_chars:
            chunks.append((start, "".join(parts)))
            parts = []
    rest = "".join(parts)
    if rest.strip():
        if chunks and len(rest) < chunk_chars // 2:
            chunks[-1] = (chunks[-1][0], chunks[-1][1] + rest)
        else:
            chunks.append((start, rest))
    return chunks


@extractor("text_chunks")
def text_chunks(spec: SourceSpec, files: list[Path]) -> Iterator[RawDoc]:
    """Text files cut into paragraph chunks; JSONL files (by suffix) read record by record."""
    chunk = int(spec.option("chunk_chars", 2000))
    try:
        for path in files:
            if path.suffix in (".jsonl", ".ndjson"):
                # records are often short: consecutive records are grouped like paragraphs
                records = ((r.locator.rsplit("#", 1)[1], r.text) for r in jsonl(spec, [path]))
                yield from chunk_entries(records, chunk, path.as_posix())
                continue
            text = read_text(path, strict=True)   # binary files are skipped; broken text is an error
            if text is None:
                continue
            for offset, piece in paragraphs_to_chunks(text, chunk):
                yield RawDoc(f"{path.as_posix()}@{offset}", piece, path.as_posix())
    except UnreadableFile as e:
        raise BadInput(f"--corpus: {e}") from None


def corpus_scenario(path: str | Path, defaults: dict | None = None, name: str | None = None,
                    text_field: str = "text", chunk_chars: int = 2000, min_doc_chars: int = 200) -> Scenario:
    try:
        p = Path(path).expanduser().resolve(strict=True)
    except FileNotFoundError:
        raise BadInput(f"--corpus {path}: no such file or directory") from None
    except (OSError, RuntimeError) as e:   # a symlink loop (RuntimeError before Python 3.13)
        raise BadInput(f"--corpus {path}: {getattr(e, 'strerror', None) or e}") from None
    stream_table = merge_tables((defaults or {}).get("stream", {}), {})
    spec = SourceSpec(
        id="corpus", extractor="text_chunks", package="", licence="user-supplied",
        root=str(p), include=("**/*",), domain="corpus",
        options=tuple(sorted({"chunk_chars": chunk_chars, "text_field": text_field}.items())),
    )
    return Scenario(
        name=name or f"corpus-{p.stem}", version=1,
        description=f"ad-hoc corpus from {p}", domain="corpus", path="",
        sources=(spec,), split=CORPUS_SPLIT, stream=parse_stream(str(p), stream_table),
        min_doc_chars=min_doc_chars, max_doc_chars=(defaults or {}).get("max_doc_chars", 20000),
    )
