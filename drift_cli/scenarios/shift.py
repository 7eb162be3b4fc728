"""Lexical shift of a split against the draft's training text: a model-free check that a
scenario differs from what the draft learnt (acceptance, measured by `drift bench`, is the
real measure).

Words are `\\w+|[^\\w\\s]`, lower-cased. Reported per scenario:
  word_oov          fraction of the split's words never seen in the draft's data
  bigram_seen       fraction of the split's word bigrams seen in the draft's data
  unigram_ce_nats   cross-entropy of the split's words under an add-one unigram model of
                    the draft's data
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass

from drift_cli.scenarios.document import Document

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class ReferenceText:
    unigrams: Counter
    bigrams: frozenset
    total: int

    @staticmethod
    def of(docs: list[Document]) -> "ReferenceText":
        uni: Counter = Counter()
        bi: set = set()
        for d in docs:
            w = words(d.text)
            uni.update(w)
            bi.update(zip(w, w[1:]))
        return ReferenceText(uni, frozenset(bi), sum(uni.values()))


@dataclass(frozen=True)
class LexicalShift:
    documents: int
    words: int
    word_oov: float
    bigram_seen: float
    unigram_ce_nats: float

    def to_json(self) -> dict:
        return asdict(self)


def lexical_shift(docs: list[Document], ref: ReferenceText) -> LexicalShift:
    w = [x for d in docs for x in words(d.text)]
    pairs = list(zip(w, w[1:]))
    vocab = len(ref.unigrams) + 1
    ce = -sum(math.log((ref.unigrams[x] + 1) / (ref.total + vocab)) for x in w) / max(len(w), 1)
    return LexicalShift(
        documents=len(docs), words=len(w),
        word_oov=sum(1 for x in w if x not in ref.unigrams) / max(len(w), 1),
        bigram_seen=sum(1 for p in pairs if p in ref.bigrams) / max(len(pairs), 1),
        unigram_ce_nats=ce,
    )
