"""The unit of splitting: one document with a stable id."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    id: str                    # "<domain>:<source id>/<path under the source root>[@entry]",
                               # e.g. "code:python-stdlib/json/decoder.py"
    text: str
    domain: str                # "prose", "code", "law", ...
    source: str                # the file it was extracted from
    date: str | None = None    # ISO date for dated documents

    def to_json(self) -> dict:
        return {"id": self.id, "text": self.text, "domain": self.domain, "source": self.source,
                "date": self.date}

    @staticmethod
    def from_json(d: dict) -> "Document":
        return Document(d["id"], d["text"], d["domain"], d["source"], d.get("date"))
