"""Draft-model methods: `ModelDraftPolicy`, γ autoregressive steps of a draft LM.

The draft LM is a draft model (`CausalLM`) or an EAGLE head (`drift_cli.eagle.drafter.HeadDrafter`,
which reads the target's hidden states): both have the same row interface, so vanilla, drift,
offline and osd run on either through the same propose loop.

The policy interface itself (`DraftPolicy`, `Rows`, `Proposal`, `Feedback`, `MethodContext`)
belongs to the engine (`drift_cli.engine.policy`); it is re-exported here for the methods.
"""

from __future__ import annotations

import torch

from drift_cli.eagle import is_head
from drift_cli.engine.graphs import make_lm
from drift_cli.engine.policy import (DraftPolicy, Feedback, MethodContext, Proposal, Rows, as_rows,  # noqa: F401
                                     ragged)
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import TreeProposal


def draft_lm(draft: torch.nn.Module, name: str = "draft"):
    """The draft LM that drives `draft`: a `HeadDrafter` for an EAGLE head, else a `CausalLM` on
    the device's engine path (`drift_cli.engine.graphs.make_lm`: CUDA graphs on a GPU)."""
    if is_head(draft):
        from drift_cli.eagle.drafter import HeadDrafter

        return HeadDrafter(draft, name)
    return make_lm(draft, name)


class ModelDraftPolicy(DraftPolicy):
    """Drafting with a draft LM: γ autoregressive steps from its KV cache.

    Subclasses change the proposal through `adjust` (sampling-space logits) and learn in `observe`.
    Cache invariant: the draft cache holds a prefix of the committed sequence minus its last
    token; `propose` feeds whatever committed tokens the cache lacks (1, or 2 after a bonus).
    A head (`target_layers` not empty) also takes the target's states of the committed positions
    (the prompt's in `begin_prompt`, each iteration's in `commit`); a row with no state yet (a
    one-token prompt before its first verification) drafts nothing.
    """

    uses_draft_model = True

    def __init__(self, draft: torch.nn.Module) -> None:
        self.lm = draft_lm(draft)
        self.target_layers = tuple(getattr(self.lm, "target_layers", ()))

    @classmethod
    def build(cls, ctx: MethodContext) -> "DraftPolicy":
        assert ctx.draft is not None, f"method {cls.name} needs a draft model"
        return cls(ctx.draft)

    @property
    def drafts_trees(self) -> bool:
        """Whether `propose_tree` grows real trees: with --tree-nodes, on a draft model or a head."""
        return self.tree.on

    def begin_batch(self, slots: int) -> None:
        if self.drafts_trees:
            self.lm.reset_rows(slots, row_cache=True)        # trees need the RowCache's mask at B = 1 too
        else:
            self.lm.reset_rows(slots)

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        self.lm.reset_row(self.slot)
        self.lm.clock = self.clock
        if self.target_layers:
            self.lm.add_features(self.slot, self.prompt_features)
        feed = prompt[0, self.lm.row_len(self.slot):-1]      # a draft model: all but the last token
        if len(feed):
            self.lm.forward_rows([self.slot], [feed])

    def adjust(self, hidden: torch.Tensor, logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
        """hidden [B, d], sampling-space logits [B, V] -> the logits to draw from. Identity here."""
        return logits

    @torch.inference_mode()
    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        """γ batched draft steps for every row; a row with a smaller budget keeps its first ones."""
        context = as_rows(context)
        feed: list[torch.Tensor] | torch.Tensor = [ids[self.lm.row_len(s):] for s, ids in zip(context.slots, context.ids)]
        budgets = [n if len(f) else 0 for n, f in zip(context.budgets(gamma), feed, strict=True)]
        if not any(budgets):                               # no row has anything to draft from
            return DraftPolicy.propose(self, context, gamma, sampler)
        tokens, qs, hs, zs, tops = [], [], [], [], []
        for _ in range(gamma):
            h, z = self.lm.forward_rows(context.slots, feed)
            h, z = last_positions(h, feed), last_positions(z, feed)   # [B, d], [B, V]
            logits = sampler.sampling_logits(z)            # the engine's conversion, untimed
            with self.clock.span("adjust"):                # the method's own adjustment only
                logits = self.adjust(h, logits, sampler)
            if self.p_min is not None:
                # the stop depends only on the draft's own distribution here, before a token is
                # drawn, so sampling stays exact; one host read per draft token (llama.cpp's p-min)
                top = sampler.probs(logits).amax(dim=-1)   # [B]; greedy: the T = 1 distribution
                if float(top.min()) < self.p_min:
                    break
                tops.append(top)
            x, q = sampler.pick(logits)
            tokens.append(x)
            hs.append(h)
            zs.append(z)
            if q is not None:
                qs.append(q)
            feed = x[:, None]
        if not tokens:
            return DraftPolicy.propose(self, context, gamma, sampler)
        return Proposal(
            tokens=torch.stack(tokens, 1),
            q=torch.stack(qs, 1) if qs else None,
            hidden=torch.stack(hs, 1),
            base_logits=torch.stack(zs, 1),
            top_prob=torch.stack(tops, 1) if tops else None,
        ).fit([min(n, len(tokens)) for n in budgets])   # the confidence stop may end it early

    def adjust_nodes(self, hidden: torch.Tensor, logits: torch.Tensor, rows: list[int], sampler: Sampler) -> torch.Tensor:
        """A tree's frontier: hidden [F, d], sampling-space logits [F, V], rows[i] the context row of
        node i -> the logits to draw from. `adjust` itself unless the method needs the rows."""
        return self.adjust(hidden, logits, sampler)

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler) -> TreeProposal:
        """A tree per row (`drift_cli.methods.tree_draft`)."""
        if not self.drafts_trees:
            return super().propose_tree(context, gamma, sampler)
        from drift_cli.methods.tree_draft import draft_tree

        self._slots = as_rows(context).slots
        tree, self._drafted = draft_tree(self, context, gamma, sampler)
        return tree

    def accept_tree(self, paths: list[list[int]]) -> None:
        """Move the accepted path's draft cache entries into place: the leading accepted nodes that
        were fed (expanded); the rest is fed again by the next proposal, as after a chain."""
        if not self.drafts_trees:
            return
        drafted, fed = self._drafted, []
        for slots, path in zip(drafted.slots, paths, strict=True):
            run = []
            for node in path:
                if slots[node] is None:
                    break
                run.append(slots[node])
            fed.append(run)
        self.lm.keep_rows(self._slots, fed, drafted.base)

    def commit(self, context: Rows) -> None:
        context = as_rows(context)
        self.lm.crop_rows(context.slots, [len(ids) - 1 for ids in context.ids])
        if self.target_layers and context.features is not None:
            for slot, features in zip(context.slots, context.features, strict=True):
                self.lm.add_features(slot, features)


def last_positions(x: torch.Tensor, feed: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """x [B, S, ...] from `CausalLM.forward_rows(feed)` -> [B, ...] at each row's last fed position."""
    if isinstance(feed, torch.Tensor) or all(len(f) == x.shape[1] for f in feed):
        return x[:, -1]
    last = torch.tensor([len(f) - 1 for f in feed], device=x.device)
    return x[torch.arange(x.shape[0], device=x.device), last]
