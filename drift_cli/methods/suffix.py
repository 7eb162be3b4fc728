"""`suffix`: SuffixDecoding-style drafting (ArcticInference; vLLM's `suffix`), no draft model.

Two suffix tries (`drift_cli.suffix_tree`) are searched each iteration with the last
--suffix-max-depth tokens of the context:
  * the prompt trie: the current prompt and its committed output, grown in `commit`;
  * the stream trie of the prompt's tenant: the target's committed outputs of the earlier
    prompts of the stream (added at `end_prompt`), within a --suffix-max-tokens budget shared by
    all tenants, oldest outputs evicted first.
Each trie offers its best draft (most frequent continuation, length <= min(γ, match length x
--suffix-max-spec-factor), path probability >= --suffix-min-token-prob); the higher-scoring one
is proposed as a point mass (`Proposal.q = None`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from drift_cli.engine.sampling import Sampler
from drift_cli.knobs import Settings, at_least, between, knob
from drift_cli.methods.base import DraftPolicy, MethodContext, Proposal
from drift_cli.suffix_tree import Draft, SuffixCache, SuffixTrie

DEFAULT_TENANT = "default"
PROMPT_DOC = 0


@dataclass(frozen=True)
class SuffixConfig(Settings):
    # longest suffix kept in the tries (vLLM's default tree depth)
    max_depth: int = knob(24, "--suffix-max-depth", "suffix: longest suffix kept and matched",
                          ok=at_least(1), rule="must be >= 1")
    # draft length <= match length x this factor (and <= γ)
    max_spec_factor: float = knob(1.0, "--suffix-max-spec-factor", "suffix: draft at most match length x this many tokens",
                                  ok=lambda x: 0 < x < float("inf"), rule="must be > 0")
    # stop the draft when its path probability drops below this
    min_token_prob: float = knob(0.1, "--suffix-min-token-prob", "suffix: stop drafting below this path probability",
                                 ok=between(0.0, 1.0), rule="must be in [0, 1]")
    # output tokens held by the stream tries, all tenants together
    max_tokens: int = knob(65536, "--suffix-max-tokens",
                           "suffix: output tokens kept from earlier prompts, oldest evicted first",
                           ok=at_least(1), rule="must be >= 1")


class SuffixDecoding(DraftPolicy):
    name = "suffix"
    description = "suffix-tree drafting over the stream's earlier outputs and the current context (no draft model)"
    configs = (SuffixConfig,)

    def __init__(self, cfg: SuffixConfig = SuffixConfig()) -> None:
        self.cfg = cfg.validate()
        self.begin_stream()

    @classmethod
    def build(cls, ctx: MethodContext) -> "SuffixDecoding":
        return cls(ctx.config(SuffixConfig))

    def begin_stream(self) -> None:
        self.cache = SuffixCache(self.cfg.max_depth, self.cfg.max_tokens)
        self.local = SuffixTrie(self.cfg.max_depth)
        self.tenant = DEFAULT_TENANT
        self.peak_prompt_nodes = 0
        self.drafts_from = {"prompt": 0, "stream": 0}

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        self.tenant = tenant or DEFAULT_TENANT
        self.local = SuffixTrie(self.cfg.max_depth)
        self.local.extend(PROMPT_DOC, prompt[0].tolist())

    @property
    def _context(self) -> list[int]:
        return self.local.docs.get(PROMPT_DOC, [])

    def draft(self, gamma: int) -> tuple[Draft, str]:
        """The better of the prompt trie's and the stream trie's drafts for the current context."""
        ctx = self._context
        pattern = ctx[len(ctx) - min(len(ctx), self.cfg.max_depth):]
        args = (gamma, self.cfg.max_spec_factor, self.cfg.min_token_prob)
        best, source = self.local.speculate(pattern, *args), "prompt"
        stream = self.cache.tree(self.tenant)
        if stream is not None:
            other = stream.speculate(pattern, *args)
            if other.score > best.score:
                best, source = other, "stream"
        return best, source

    def propose(self, context: torch.Tensor, gamma: int, sampler: Sampler) -> Proposal:
        found, source = self.draft(gamma) if gamma > 0 else (Draft(), "")
        if found.tokens:
            self.drafts_from[source] += 1
        ids = torch.tensor([found.tokens], dtype=torch.long).to(context.device)   # [1, k], k <= γ
        return Proposal(tokens=ids.view(1, len(found.tokens)))

    def commit(self, context: torch.Tensor) -> None:
        self.local.extend(PROMPT_DOC, context[0, len(self._context):].tolist())

    def end_prompt(self, output: torch.Tensor) -> None:
        self.peak_prompt_nodes = max(self.peak_prompt_nodes, self.local.nodes)
        self.cache.add(self.tenant, output[0].tolist())

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
