"""Prompt streams: windows of `prompt_tokens` tokens cut from a split's documents.

Everything is a function of (documents, tokenizer, stream spec): window offsets and document
order come from salted sha256 hashes of document ids, the mixture schedule from a seeded RNG.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Iterator

from drift_cli.errors import BadInput
from drift_cli.registry import suggest
from drift_cli.scenarios.document import Document
from drift_cli.scenarios.schema import StreamSpec
from drift_cli.stream import Prompt

CHARS_PER_TOKEN_BOUND = 8    # a window's text slice is prompt_tokens * 8 chars: enough for BPE


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()[:8], "big")


def _snap(text: str, pos: int) -> int:
    """Move an offset to the next line start (or word start) so windows begin on a boundary."""
    nl = text.find("\n", pos, pos + 400)
    if nl != -1:
        return nl + 1
    sp = text.find(" ", pos, pos + 80)
    return sp + 1 if sp != -1 else pos


def window_ids(doc: Document, tokenizer, prompt_tokens: int, k: int, salt: str) -> tuple[int, ...] | None:
    """The k-th prompt window of a document, or None when the document is too short.

    Windows start at hashed offsets (snapped to a line or word start) that leave at least one
    window's worth of text after them for the continuation; not at the document's beginning,
    where boilerplate headers (licence banners, copyright-format lines) would repeat across
    documents. A document too short for that gives one window, from its start.
    """
    span = prompt_tokens * CHARS_PER_TOKEN_BOUND
    text = doc.text
    room = len(text) - 2 * span
    if room <= 0:
        if k > 0:
            return None
        start = 0
    else:
        start = _snap(text, _h(salt, doc.id, k) % room)
    ids = tokenizer.encode(text[start:start + span], add_special_tokens=False)
    return tuple(ids[:prompt_tokens]) if len(ids) >= prompt_tokens else None


def _domain_windows(docs: list[Document], tokenizer, spec: StreamSpec, salt: str) -> Iterator[Prompt]:
    """Windows of a domain's documents: one per document in hash order, then a second round..."""
    order = sorted(docs, key=lambda d: _h(salt, "order", d.id))
    for k in range(spec.windows_per_doc):
        seen_round = False
        for d in order:
            ids = window_ids(d, tokenizer, spec.prompt_tokens, k, salt)
            if ids is not None:
                seen_round = True
                yield Prompt(ids=ids, doc_id=d.id, domain=d.domain)
        if not seen_round:
            return


def _by_domain(docs: list[Document], tokenizer, spec: StreamSpec, salt: str) -> dict[str, Iterator[Prompt]]:
    domains: dict[str, list[Document]] = {}
    for d in docs:
        domains.setdefault(d.domain, []).append(d)
    return {name: _domain_windows(ds, tokenizer, spec, salt) for name, ds in sorted(domains.items())}


def _take_blocks(sources: dict[str, Iterator[Prompt]], n: int, block: int) -> list[Prompt]:
    """Round-robin over domains, `block` consecutive prompts from each; exhausted domains drop out."""
    out: list[Prompt] = []
    live = dict(sources)
    while live and len(out) < n:
        for name in list(live):
            for _ in range(block):
                p = next(live[name], None)
                if p is None:
                    live.pop(name)
                    break
                out.append(p)
                if len(out) == n:
                    return out
    return out


def mixture_weights(i: int, n: int, domains: int, width: float = 0.6) -> list[float]:
    """Smoothly drifting domain weights: a Gaussian bump moving across the domains as the
    stream advances (position i of n); every domain keeps a small floor weight."""
    t = (i / max(n - 1, 1)) * (domains - 1)
    w = [math.exp(-((t - d) ** 2) / (2 * width**2)) + 0.02 for d in range(domains)]
    s = sum(w)
    return [x / s for x in w]


def _take_mixture(sources: dict[str, Iterator[Prompt]], n: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    names = list(sources)
    out: list[Prompt] = []
    live = set(names)
    i = 0
    while live and len(out) < n:
        w = [x if name in live else 0.0 for x, name in zip(mixture_weights(i, n, len(names)), names)]
        name = rng.choices(names, weights=w)[0]
        p = next(sources[name], None)
        if p is None:
            live.discard(name)
            continue
        out.append(p)
        i += 1
    return out


def _take_shuffled(docs: list[Document], tokenizer, spec: StreamSpec, salt: str, n: int) -> list[Prompt]:
    out: list[Prompt] = []
    for p in _domain_windows(docs, tokenizer, spec, salt):
        out.append(p)
        if len(out) == n:
            break
    return out


def choose_order(spec: StreamSpec, variant: str | None, scenario: str) -> str:
    offered = (spec.order, *spec.variants)
    if variant is None:
        return spec.order
    if variant not in offered:
        raise BadInput(f"scenario '{scenario}' has no stream variant '{variant}'{suggest(variant, offered)}; "
                       f"choose from: {', '.join(offered)}")
    return variant


def assemble_prompts(docs: list[Document], tokenizer, spec: StreamSpec, order: str, n: int,
                     salt: str) -> list[Prompt]:
    if order == "shuffle":
        prompts = _take_shuffled(docs, tokenizer, spec, salt, n)
    elif order in ("interleave", "block"):
        block = 1 if order == "interleave" else spec.block_prompts
        prompts = _take_blocks(_by_domain(docs, tokenizer, spec, salt), n, block)
    else:
        prompts = _take_mixture(_by_domain(docs, tokenizer, spec, salt), n, _h(salt, "mixture"))
    if spec.tenants == "domain":
        prompts = [Prompt(p.ids, p.doc_id, p.domain, tenant=p.domain) for p in prompts]
    return prompts
