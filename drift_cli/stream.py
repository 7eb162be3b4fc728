"""A prompt stream: the ordered workload one method run processes.

Adaptive state (the DRIFT bank, OSD's weights, the suffix tree) persists across the prompts
of one stream and never across streams, methods or runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]          # prompt token ids
    doc_id: str                   # source document id (splits are disjoint by document)
    domain: str = ""              # e.g. "code", "law"; the nonstationary stream mixes several
    tenant: str | None = None     # tenant id when the stream is multi-tenant


@dataclass
class Stream:
    scenario: str
    split: str                    # "train" | "dev" | "test"
    prompts: list[Prompt]
    max_new_tokens: int
    meta: dict = field(default_factory=dict)

    def identity(self) -> str:
        """sha256 over the prompts (ids, doc ids, domains, tenants) and the generation length."""
        h = hashlib.sha256()
        h.update(json.dumps({"max_new_tokens": self.max_new_tokens}).encode())
        for p in self.prompts:
            h.update(json.dumps([list(p.ids), p.doc_id, p.domain, p.tenant]).encode())
        return h.hexdigest()
