"""The policy interface of the one engine loop: what a draft policy is given and returns.

A method differs from another only in how it drafts and what it does with verification
feedback. The engine (`drift_cli.engine.loop`) owns the target, the acceptance rule and the
timing; a policy owns its drafter (a draft LM, an n-gram table, nothing at all for `ar`).

Per iteration the engine calls, in order:
    propose(rows, gamma, sampler) -> Proposal       # timed as "draft"
    (target verifies; exact acceptance)             # timed as "verify"
    commit(new_rows)                                # roll caches back to the accepted prefix
    observe(feedback)                               # timed as "adapt"
Per stream: begin_stream, begin_batch(slots), ..., end_stream. Per row: begin_prompt / end_prompt,
with `self.slot` naming the row's slot (0..slots-1). `rows` is a `Rows`: the active rows of the
iteration in slot order, each with its own committed ids; a proposal is ragged (tokens [B, γ]
plus num_draft [B]). Batch size 1 is one row in slot 0.

Target features. A policy whose drafter reads the target's hidden states (an EAGLE head) names
them in `target_layers` (Hugging Face hidden-state indices: k < L the input of target layer k,
L or -1 the final post-norm state; concatenated in that order). The engine then records them
during the target passes it runs anyway and hands them over as they become known, each row's
in position order, for the committed positions the target has scored (every committed position
but the last, as the target's cache holds): the prompt's in `prompt_features` before
`begin_prompt`, each iteration's newly committed ones in `commit`'s `Rows.features`, and all the
scored positions [last, x1..xk] in `Feedback.target_features`.

The methods (`drift_cli.methods`) implement `DraftPolicy`; this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

import torch

from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import TreeConfig, TreeProposal, chain_parents
from drift_cli.engine.timing import IterationClock, NullClock


@dataclass
class Rows:
    """The rows of one decoding iteration, in slot order."""

    slots: list[int]
    ids: list[torch.Tensor]                  # per row: its committed ids [L_b] (prompt + output so far)
    tenants: list[str | None]
    budget: list[int] | None = None          # per row: the most it may draft now (propose only; None: gamma)
    # commit only, when the policy asks for target features: per row [e_b, F], the target's states
    # at the positions this iteration committed that it scored (the row's previous last token and
    # its accepted drafts: e_b = tokens it emitted), continuing the row's earlier ones
    features: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]

    def budgets(self, gamma: int) -> list[int]:
        """Each row's draft budget, at most gamma."""
        return [gamma] * len(self) if self.budget is None else [max(0, min(gamma, b)) for b in self.budget]

    def with_ids(self, ids: list[torch.Tensor], features: list[torch.Tensor] | None = None) -> "Rows":
        return Rows(self.slots, ids, self.tenants, features=features)


def as_rows(context: "Rows | torch.Tensor") -> Rows:
    """A [B, L] tensor (one prompt per row, slots 0..B-1, no tenant) as `Rows`; `Rows` as they are."""
    if isinstance(context, Rows):
        return context
    return Rows(list(range(context.shape[0])), list(context), [None] * context.shape[0])


@dataclass
class Proposal:
    tokens: torch.Tensor                     # [B, k] int64; k may be 0 (nothing drafted)
    #                                          row b's drafts are tokens[b, :num_draft[b]], the rest padding
    q: torch.Tensor | None = None            # [B, k, V] the distribution each token was drawn from
    #                                          (after any adjustment); None when greedy or when the
    #                                          proposal is a point mass (model-free drafters)
    hidden: torch.Tensor | None = None       # [B, k, d] draft hidden state (lm_head input) per position
    base_logits: torch.Tensor | None = None  # [B, k, V] raw draft logits before any adjustment
    num_draft: torch.Tensor | None = None    # [B] int64 on the CPU: tokens drafted per row (None: k each)
    top_prob: torch.Tensor | None = None     # [B, k] the top probability of each position's q' (only
    #                                          when a `confidence` γ controller asked for it)
    source: list[str] | None = None          # per row: which source proposed it (`hybrid`; None: the method)

    @property
    def k(self) -> int:
        """The proposal's width: the most any row drafted."""
        return self.tokens.shape[1]

    @property
    def lengths(self) -> list[int]:
        """Tokens drafted per row."""
        return [self.k] * self.tokens.shape[0] if self.num_draft is None else self.num_draft.tolist()

    def truncate(self, k: int) -> "Proposal":
        cut = lambda t: None if t is None else t[:, :k]  # noqa: E731
        nd = None if self.num_draft is None else self.num_draft.clamp(max=k)
        return Proposal(self.tokens[:, :k], cut(self.q), cut(self.hidden), cut(self.base_logits), nd, cut(self.top_prob),
                        self.source)

    def fit(self, lengths: list[int]) -> "Proposal":
        """The proposal with row b cut to lengths[b] <= its drafts, the width to the longest."""
        width = max(lengths, default=0)
        if all(n == width for n in lengths):
            return self if width == self.k and self.num_draft is None else self.truncate(width).uniform()
        out = self.truncate(width)
        out.num_draft = torch.tensor(lengths, dtype=torch.long)
        return out

    def uniform(self) -> "Proposal":
        self.num_draft = None
        return self


def ragged(rows: list[list[int]], device) -> Proposal:
    """A point-mass proposal from per-row token lists (model-free drafters)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = [len(r) for r in rows]
    nd = None if all(n == width for n in lengths) else torch.tensor(lengths, dtype=torch.long)
    return Proposal(tokens=ids.to(device), num_draft=nd)


@dataclass
class Feedback:
    """What verification revealed, at every drafted position (accepted or not). Row b's
    positions are its first proposal.lengths[b] (+1 for target_logits); the rest is padding."""

    context: Rows                # the rows' committed ids before this iteration (prompt + output so far)
    proposal: Proposal
    target_logits: torch.Tensor  # [B, k+1, V] raw target logits for positions [last, x1..xk]
    accepted: torch.Tensor       # [B] int64: accepted draft tokens
    next_token: torch.Tensor     # [B] int64: the correction (or bonus) token
    sampler: Sampler
    step: int                    # verification step index within the stream
    target_hidden: torch.Tensor | None = None  # [B, k+1, d_target] the target's lm_head inputs
    target_features: torch.Tensor | None = None  # [B, k+1, F] the policy's `target_layers` there (or None)
    # trees (`--tree-nodes`): the proposal is the chain view of the accepted path (each row's path, then
    # its first rejected candidate; `drift_cli.engine.tree.chain_view`), and this holds the whole step
    tree: "TreeStep | None" = None


@dataclass
class TreeStep:
    """What verifying a tree revealed, beyond the chain view."""

    proposal: TreeProposal
    target_logits: torch.Tensor              # [B, N+1, V] raw target logits: [:, 0] at the root, [:, i + 1] at node i
    paths: list[list[int]]                   # per row: the accepted nodes, from the root down


S = TypeVar("S")


@dataclass
class MethodContext:
    """Everything a method may need to build itself."""

    draft: torch.nn.Module | None            # the (shared, frozen) draft model; copy it before training it
    draft_path: Path | None
    draft_fingerprint: str | None
    eos_id: int | None
    vocab_size: int
    # the methods' settings (`drift_cli.methods.method_settings`) by class; a class absent here means its defaults
    configs: dict[type, Any] = field(default_factory=dict)
    scenario: str = ""
    seed: int = 0
    # Returns the path of a cached offline draft for (scenario, divergence); set by the bench.
    resolve_offline: Callable[[str, bool], Path] | None = None   # (divergence, on_policy) -> the zoo's offline draft
    load_draft: Callable[[Path], torch.nn.Module] | None = None

    def config(self, cls: type[S]) -> S:
        """The settings instance of this class (its defaults when none was given), validated."""
        return self.configs.get(cls) or cls()

    @classmethod
    def settings_from_options(cls, options: dict[str, Any], classes: list[type]) -> dict[type, Any]:
        """Parsed CLI option values -> {settings class: instance}, each validated (BadInput)."""
        return {c: c.from_options(options).validate() for c in classes}


class DraftPolicy:
    """Base class. Subclasses set `name`, and override what they need."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    uses_draft_model: ClassVar[bool] = False
    drafts: ClassVar[bool] = True        # False (`ar`): the γ controller does not apply
    # A plugin method's settings dataclasses (fields made with `drift_cli.knobs.knob`): `drift
    # bench`, `ablate` and `analyze` generate their flags from these (`drift_cli.commands.options`).
    # The built-in methods declare theirs in the registry (`drift_cli.methods`), torch-free.
    configs: ClassVar[tuple[type, ...]] = ()

    clock: IterationClock = NullClock()
    slot: int = 0                            # the row begin_prompt / end_prompt are about (set by the engine)
    # Set by the engine for the `confidence` γ controller: a drafter that can stop early stops
    # before the first position whose proposal's top probability is below this.
    p_min: float | None = None
    # The target hidden states the drafter reads (see the module's docstring); () : none, nothing recorded.
    target_layers: tuple[int, ...] = ()
    # Set by the engine before `begin_prompt` when target_layers is not empty: the prompt's features
    # [P-1, F] at its positions but the last (None for a one-token prompt).
    prompt_features: torch.Tensor | None = None
    # Set by the engine before `begin_batch`: the trees asked for (`--tree-nodes`; off: chains)
    tree: TreeConfig = TreeConfig()

    @classmethod
    def build(cls, ctx: MethodContext) -> "DraftPolicy":
        return cls()

    def begin_stream(self) -> None:
        """Reset adaptive state: called once before the first prompt of a stream."""

    def begin_batch(self, slots: int) -> None:
        """The engine decodes `slots` rows at once from now on (before their first prompts)."""

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        """prompt: [1, P], the new prompt of row `self.slot`. Prefill its caches, note its tenant."""

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        """Draft up to gamma tokens (and row b at most context.budget[b]) after each row."""
        rows = as_rows(context)
        return Proposal(tokens=torch.empty((len(rows), 0), dtype=torch.long, device=rows.ids[0].device))

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler) -> TreeProposal:
        """Draft a tree of at most `self.tree.nodes` nodes and depth gamma (row b: context.budget[b])
        after each row. Here: the chain `propose` drafts, as a tree (one child per node)."""
        prop = self.propose(context, gamma, sampler)
        return TreeProposal(prop.tokens, [chain_parents(n) if n else [] for n in prop.lengths], prop.q, prop.hidden,
                            prop.base_logits, prop.source)

    def accept_tree(self, paths: list[list[int]]) -> None:
        """After a tree's verification, before `commit`: each row's accepted nodes (from the root
        down) of the last `propose_tree`, so that the drafter moves their cache entries into place."""

    def commit(self, context: Rows) -> None:
        """The rows' committed sequences after verification: roll caches back to them."""

    def observe(self, feedback: Feedback) -> None:
        """Learn from verification (timed as adaptation)."""

    def end_prompt(self, output: torch.Tensor) -> None:
        """output: [1, n] the ids generated for row `self.slot`'s prompt, which has finished."""

    def end_stream(self) -> None:
        """After the last prompt of a stream (also after an interrupt): persist state, if any."""

    def report(self) -> dict[str, Any]:
        """Method-specific figures for run.json (memory, bank statistics, ...)."""
        return {}
