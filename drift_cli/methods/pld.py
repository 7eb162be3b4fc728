"""`pld`: prompt-lookup drafting (transformers' `prompt_lookup_num_tokens`, vLLM's `ngram`).

No draft model. Each iteration matches the last n tokens of the context (n = --pld-max-ngram
down to 1) against earlier positions of the same context and proposes up to γ tokens that
followed the most recent earlier occurrence; no match drafts nothing (the target emits one
token). The proposal is a point mass (`Proposal.q = None`), which the acceptance rule handles
exactly. An incremental index (n-gram -> last position it was followed from) makes a lookup
O(max_ngram) instead of a scan of the context. Batches: one index per slot (its row's context).
"""

from __future__ import annotations

from typing import Any

import torch

from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import TreeProposal, from_paths, merge_paths
from drift_cli.methods.base import DraftPolicy, MethodContext, Proposal, Rows, as_rows, ragged
from drift_cli.methods.settings import PldConfig


class NgramIndex:
    """The context's tokens and, per n <= max_ngram, the last end position of every n-gram that
    is followed by at least one token (so a lookup never finds the context's own suffix)."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.ids: list[int] = []
        self.last_end: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]

    def append(self, token: int) -> None:
        self.ids.append(token)
        e = len(self.ids) - 2                     # the n-grams ending here are now followed
        for n in range(1, min(self.max_ngram, e + 1) + 1):
            self.last_end[n][tuple(self.ids[e - n + 1:e + 1])] = e

    def lookup(self, max_tokens: int) -> list[int]:
        """Tokens after the most recent earlier occurrence of the longest matching suffix n-gram."""
        for n in range(min(self.max_ngram, len(self.ids)), 0, -1):
            e = self.last_end[n].get(tuple(self.ids[-n:]))
            if e is not None:
                return self.ids[e + 1:e + 1 + max_tokens]
        return []

    def lookups(self, max_tokens: int) -> list[list[int]]:
        """Several matches: for each suffix length n (longest first), the tokens after the most
        recent earlier occurrence of the context's last n-gram; distinct ones only."""
        out: list[list[int]] = []
        for n in range(min(self.max_ngram, len(self.ids)), 0, -1):
            e = self.last_end[n].get(tuple(self.ids[-n:]))
            if e is not None and (found := self.ids[e + 1:e + 1 + max_tokens]) not in out:
                out.append(found)
        return out

    @property
    def entries(self) -> int:
        return sum(len(d) for d in self.last_end)


class PromptLookup(DraftPolicy):
    name = "pld"
    description = "prompt-lookup drafting: copy what followed the last n-gram's previous occurrence (no draft model)"

    def __init__(self, cfg: PldConfig = PldConfig()) -> None:
        self.cfg = cfg.validate()
        self.indexes: dict[int, NgramIndex] = {0: NgramIndex(self.cfg.max_ngram)}   # slot -> its row's index
        self.peak_entries = 0

    @property
    def index(self) -> NgramIndex:
        """Slot 0's index (batch size 1's only row)."""
        return self.indexes[0]

    @classmethod
    def build(cls, ctx: MethodContext) -> "PromptLookup":
        return cls(ctx.config(PldConfig))

    def begin_stream(self) -> None:
        self.peak_entries = 0

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        index = self.indexes[self.slot] = NgramIndex(self.cfg.max_ngram)
        for t in prompt[0].tolist():
            index.append(t)

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        context = as_rows(context)
        found = [self.indexes[s].lookup(n) if n > 0 else []
                 for s, n in zip(context.slots, context.budgets(gamma), strict=True)]
        return ragged(found, context.ids[0].device)

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler) -> TreeProposal:
        """Several matches (`NgramIndex.lookups`) merged into one tree of at most --tree-nodes nodes."""
        context = as_rows(context)
        if not self.tree.on:
            return super().propose_tree(context, gamma, sampler)
        found = [merge_paths(self.indexes[s].lookups(n) if n > 0 else [], self.tree.nodes)
                 for s, n in zip(context.slots, context.budgets(gamma), strict=True)]
        return from_paths(found, context.ids[0].device)

    def commit(self, context: Rows) -> None:
        context = as_rows(context)
        for s, ids in zip(context.slots, context.ids, strict=True):
            index = self.indexes[s]
            for t in ids[len(index.ids):].tolist():
                index.append(t)

    def end_prompt(self, output: torch.Tensor) -> None:
        self.peak_entries = max(self.peak_entries, self.indexes[self.slot].entries)

    def report(self) -> dict[str, Any]:
        return {"pld_max_ngram": self.cfg.max_ngram, "pld_index_entries_peak": self.peak_entries}
