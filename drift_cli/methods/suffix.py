"""`suffix`: SuffixDecoding-style drafting (ArcticInference; vLLM's `suffix`), no draft model.

Two suffix tries (`drift_cli.suffix_tree`) are searched each iteration with the last
--suffix-max-depth tokens of the context:
  * the prompt trie: the current prompt and its committed output, grown in `commit`;
  * the stream trie of the prompt's tenant: the target's committed outputs of the earlier
    prompts of the stream (added at `end_prompt`), within a --suffix-max-tokens budget shared by
    all tenants, oldest outputs evicted first.
Each trie offers its best draft (most frequent continuation, length <= min(γ, match length x
--suffix-max-spec-factor), path probability >= --suffix-min-token-prob); the higher-scoring one
is proposed as a point mass (`Proposal.q = None`). Batches: one prompt trie per slot; rows of a
tenant share its stream trie, which a row's output joins when the row finishes.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from drift_cli.engine.sampling import Sampler
from drift_cli.methods.base import DraftPolicy, MethodContext, Proposal, Rows, as_rows, ragged
from drift_cli.methods.settings import SuffixConfig
from drift_cli.engine.tree import TreeProposal, from_paths
from drift_cli.suffix_tree import Draft, SuffixCache, SuffixTrie, TreeDraft

DEFAULT_TENANT = "default"
PROMPT_DOC = 0


class SuffixDecoding(DraftPolicy):
    name = "suffix"
    description = "suffix-tree drafting over the stream's earlier outputs and the current context (no draft model)"

    def __init__(self, cfg: SuffixConfig = SuffixConfig()) -> None:
        self.cfg = cfg.validate()
        self.begin_stream()

    @classmethod
    def build(cls, ctx: MethodContext) -> "SuffixDecoding":
        return cls(ctx.config(SuffixConfig))

    def begin_stream(self) -> None:
        self.cache = SuffixCache(self.cfg.max_depth, self.cfg.max_tokens)
        self.locals: dict[int, SuffixTrie] = {0: SuffixTrie(self.cfg.max_depth)}   # slot -> prompt trie
        self.tenants: dict[int, str] = {0: DEFAULT_TENANT}
        self.peak_prompt_nodes = 0
        self.drafts_from = {"prompt": 0, "stream": 0}

    @property
    def local(self) -> SuffixTrie:
        """Slot 0's prompt trie (batch size 1's only row)."""
        return self.locals[0]

    @property
    def tenant(self) -> str:
        return self.tenants[0]

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        self.tenants[self.slot] = tenant or DEFAULT_TENANT
        local = self.locals[self.slot] = SuffixTrie(self.cfg.max_depth)
        local.extend(PROMPT_DOC, prompt[0].tolist())

    @property
    def _context(self) -> list[int]:
        return self._row_context(0)

    def _row_context(self, slot: int) -> list[int]:
        return self.locals[slot].docs.get(PROMPT_DOC, [])

    def draft(self, gamma: int, slot: int = 0) -> tuple[Draft, str]:
        """The better of the prompt trie's and the stream trie's drafts for the slot's context."""
        ctx = self._row_context(slot)
        pattern = ctx[len(ctx) - min(len(ctx), self.cfg.max_depth):]
        args = (gamma, self.cfg.max_spec_factor, self.cfg.min_token_prob)
        best, source = self.locals[slot].speculate(pattern, *args), "prompt"
        stream = self.cache.tree(self.tenants[slot])
        if stream is not None:
            other = stream.speculate(pattern, *args)
            if other.score > best.score:
                best, source = other, "stream"
        return best, source

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        context = as_rows(context)
        rows = []
        for s, n in zip(context.slots, context.budgets(gamma), strict=True):
            found, source = self.draft(n, s) if n > 0 else (Draft(), "")
            if found.tokens:
                self.drafts_from[source] += 1
            rows.append(list(found.tokens))                                 # k <= its budget <= γ
        return ragged(rows, context.ids[0].device)

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler) -> TreeProposal:
        """SuffixDecoding's speculation trees (`SuffixTrie.speculate_tree`), the better-scoring of
        the prompt trie's and the stream trie's per row, as point masses."""
        context = as_rows(context)
        if not self.tree.on:
            return super().propose_tree(context, gamma, sampler)
        found = []
        for s, n in zip(context.slots, context.budgets(gamma), strict=True):
            ctx = self._row_context(s)
            pattern = ctx[len(ctx) - min(len(ctx), self.cfg.max_depth):]
            args = (n, self.tree.nodes, self.cfg.max_spec_factor, self.cfg.min_token_prob)
            best, source = (self.locals[s].speculate_tree(pattern, *args), "prompt") if n > 0 else (TreeDraft(), "")
            stream = self.cache.tree(self.tenants[s])
            if n > 0 and stream is not None and (other := stream.speculate_tree(pattern, *args)).score > best.score:
                best, source = other, "stream"
            if best.tokens:
                self.drafts_from[source] += 1
            found.append(best)
        return from_paths([(t.tokens, t.parents) for t in found], context.ids[0].device)

    def commit(self, context: Rows) -> None:
        context = as_rows(context)
        for s, ids in zip(context.slots, context.ids, strict=True):
            self.locals[s].extend(PROMPT_DOC, ids[len(self._row_context(s)):].tolist())

    def end_prompt(self, output: torch.Tensor) -> None:
        local = self.locals[self.slot]
        self.peak_prompt_nodes = max(self.peak_prompt_nodes, local.nodes)
        self.cache.add(self.tenants[self.slot], output[0].tolist())

    def report(self) -> dict[str, Any]:
        return {
            "suffix_stream_nodes": self.cache.nodes,
            "suffix_stream_nodes_peak": self.cache.peak_nodes,
            "suffix_stream_tokens": self.cache.tokens,
            "suffix_stream_documents": self.cache.documents,
            "suffix_stream_tenants": len(self.cache.trees),
            "suffix_evictions": self.cache.evictions,
            "suffix_prompt_nodes_peak": self.peak_prompt_nodes,
            "suffix_drafts_from_prompt": self.drafts_from["prompt"],
            "suffix_drafts_from_stream": self.drafts_from["stream"],
            "suffix_config": {f.name: getattr(self.cfg, f.name) for f in fields(self.cfg)},
        }
