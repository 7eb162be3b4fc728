"""`hybrid`: copying where the stream repeats, the model draft elsewhere, chosen per row and per step.

Two sources, each with its own settings unchanged:
  * the copying source, `--hybrid-copy`: `suffix` (default) or `pld`;
  * the model source, `--hybrid-model`: `drift` (default), `vanilla`, `offline` or `osd`.
Each iteration every row asks the copying source for its draft and a rule (`--hybrid-rule`)
decides which source proposes for that row:
  * `score` (default): copy when the draft's score clears `--hybrid-min-score`. The score is the
    suffix draft's expected accepted length from the trie's counts (the sum of its tokens' path
    probabilities, ArcticInference's score); a `pld` draft, one earlier occurrence and no counts,
    scores its length;
  * `length`: copy when the copying draft has at least `--hybrid-min-length` tokens;
  * `learned`: copy when the draft's expected accepted length under the row's running acceptance
    a of copying (a + a² + ... + aⁿ for n tokens) clears `--hybrid-min-score`. a is an EMA
    (weight LEARNED_RATE, prior LEARNED_PRIOR at each new prompt) of the accepted share of the
    copying drafts: the proposed ones, and on steps where the model proposed, the held copying
    draft against the tokens the target committed (oracle-free: only committed tokens).
A row with no copying draft always goes to the model source. Rows of both kinds verify in one
target pass: the proposal is merged (a copied row's q is its point mass where the model rows'
q is needed) and each row is labelled with its source (`Proposal.source`, `steps.jsonl`).

Both sources stay correct whoever proposed:
  * the copying source's tries/index see every committed token (`commit` goes to both);
  * the model draft's cache is never re-prefilled: a row that copied lags behind, and the next
    time the model source drafts for it the tokens it lacks are fed in the first draft forward,
    batched with the other rows' (`ModelDraftPolicy.propose` feeds whatever the cache lacks); an
    EAGLE head takes the target's states of every committed position through `commit` whoever
    proposed, so its catch-up pairs are real ones too;
  * the model source observes the verification of the rows it proposed for (a sub-batch of the
    feedback). With `--hybrid-learn-copied` it also learns from the copied rows: the draft runs
    teacher-forced over the copied tokens (its own draft steps, the copied tokens in place of its
    picks, so DRIFT retrieves and updates as on its own steps; that forward is the catch-up too)
    and observes the target's distributions at those positions; timed as adaptation.

Trees (`--tree-nodes`): the rule chooses as above, from the copying source's chain draft (the
same choice as without trees), and the chosen source proposes its own tree for the row: the
suffix or pld tree, or the model source's tree (EAGLE-2's from a layer draft or a head). The
trees are merged into one (`merge_trees`; a copied row's q is its point mass), the model rows'
hidden states and base logits included, since the engine cuts and renumbers the merged tree
(`tree.fit`) before its chain view reaches `observe`. After verification only the model source
moves cache entries (`accept_tree`, its rows); it observes its rows' sub-feedback, their tree
step included.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from drift_cli.drift.config import DriftFiles
from drift_cli.engine.policy import TreeStep
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import TreeProposal
from drift_cli.methods.base import (DraftPolicy, Feedback, MethodContext, ModelDraftPolicy, Proposal, Rows, as_rows,
                                    ragged)
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.offline import Offline
from drift_cli.methods.settings import HYBRID_COPY, HYBRID_MODEL, HybridConfig
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla

COPY_SOURCES: dict[str, type[DraftPolicy]] = {"suffix": SuffixDecoding, "pld": PromptLookup}
MODEL_SOURCES: dict[str, type[ModelDraftPolicy]] = {"drift": DriftMethod, "vanilla": Vanilla, "offline": Offline,
                                                    "osd": OnlineDistillation}
NONE = "none"                  # a row's label when nothing was asked of it (no draft budget)
LEARNED_RATE = 0.3             # the learned rule's EMA weight of the newest copying evidence
LEARNED_PRIOR = 0.5            # ... and its running acceptance when a prompt takes the row


@dataclass
class _Pick:
    """One row's copying draft and the rule's choice."""

    tokens: list[int] = field(default_factory=list)
    score: float = 0.0
    trie: str = ""                 # suffix: the trie it came from ("prompt" / "stream")
    copy: bool = False


def copying_draft(source: DraftPolicy, slot: int, budget: int) -> _Pick:
    """The copying source's draft for a row, with its score (expected accepted length)."""
    if budget <= 0:
        return _Pick()
    if isinstance(source, SuffixDecoding):
        draft, trie = source.draft(budget, slot)
        return _Pick(list(draft.tokens), draft.score, trie)
    tokens = source.indexes[slot].lookup(budget)
    return _Pick(tokens, float(len(tokens)))


def expected_accepted(a: float, n: int) -> float:
    """a + a² + ... + aⁿ: accepted tokens of an n-token draft when each is accepted with rate a."""
    return sum(a ** i for i in range(1, n + 1))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _Forced:
    """A sampler that picks given tokens (column by column) instead of drawing: the model
    source's own draft steps, teacher-forced over a copied block. Draws nothing."""

    def __init__(self, sampler: Sampler, tokens: torch.Tensor) -> None:
        self._sampler, self._tokens, self._i = sampler, tokens, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)

    def pick(self, sampling_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self._tokens[:, self._i]
        self._i += 1
        return x, None if self._sampler.greedy else self._sampler.probs(sampling_logits)


def sub_rows(context: Rows, ix: list[int], budgets: list[int]) -> Rows:
    """Rows ix (in order) of the iteration's, with their draft budgets."""
    return Rows([context.slots[i] for i in ix], [context.ids[i] for i in ix], [context.tenants[i] for i in ix],
                [budgets[i] for i in ix])


def select_rows(prop: Proposal, ix: list[int]) -> Proposal:
    """Rows ix of a proposal, cut to the longest of them."""
    at = torch.tensor(ix, dtype=torch.long, device=prop.tokens.device)
    pick = lambda t: None if t is None else t[at.to(t.device)]  # noqa: E731
    lengths = [prop.lengths[i] for i in ix]
    out = Proposal(prop.tokens[at], pick(prop.q), pick(prop.hidden), pick(prop.base_logits),
                   torch.tensor(lengths, dtype=torch.long), pick(prop.top_prob))
    return out.fit(lengths)


def sub_feedback(fb: Feedback, ix: list[int], proposal: Proposal, tree: TreeStep | None = None) -> Feedback:
    """The feedback of rows ix (in order) for `proposal`, their rows of the verified one (and of
    its tree step, given as `tree`)."""
    ctx = fb.context
    at = torch.tensor(ix, dtype=torch.long, device=fb.target_logits.device)
    k = proposal.k
    return Feedback(Rows([ctx.slots[i] for i in ix], [ctx.ids[i] for i in ix], [ctx.tenants[i] for i in ix]),
                    proposal, fb.target_logits[at, :k + 1], fb.accepted[at.to(fb.accepted.device)],
                    fb.next_token[at.to(fb.next_token.device)], fb.sampler, fb.step,
                    None if fb.target_hidden is None else fb.target_hidden[at, :k + 1],
                    None if fb.target_features is None else fb.target_features[at, :k + 1], tree)


def select_tree(step: TreeStep, ix: list[int]) -> TreeStep:
    """Rows ix (in order) of a verified tree step, cut to the widest of them."""
    tree = step.proposal
    width = max((len(tree.parents[i]) for i in ix), default=0)
    at = torch.tensor(ix, dtype=torch.long, device=tree.tokens.device)
    pick = lambda t: None if t is None else t[at.to(t.device), :width]  # noqa: E731
    sub = TreeProposal(tree.tokens[at, :width], [tree.parents[i] for i in ix], pick(tree.q), pick(tree.hidden),
                       pick(tree.base_logits))
    return TreeStep(sub, step.target_logits[at.to(step.target_logits.device), :width + 1], [step.paths[i] for i in ix])


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """[R, k, ...] -> [R, width, ...] with zeros after k."""
    if t.shape[1] == width:
        return t
    return torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1], *t.shape[2:])], dim=1)


def merge(b: int, copied: dict[int, list[int]], model_ix: list[int], model: Proposal, vocab: int, device) -> Proposal:
    """One proposal for b rows: row i copies copied[i] (a point mass) or, for i in model_ix (in
    order), takes its row of the model's proposal. What verification reads is merged: the tokens,
    q where the model's proposal has it (a copied row's q: its one-hot), the top probabilities
    (a copied row's: 1.0). The model's hidden states and base logits stay in its own proposal
    (`Hybrid.observe` hands that to the model source)."""
    lengths = [0] * b
    for i, toks in copied.items():
        lengths[i] = len(toks)
    for j, n in zip(model_ix, model.lengths, strict=True):
        lengths[j] = n
    width = max(lengths, default=0)
    rows = [copied.get(i, []) for i in range(b)]
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    out = Proposal(tokens, num_draft=torch.tensor(lengths, dtype=torch.long))
    if model.k > 0:
        at = torch.tensor(model_ix, dtype=torch.long, device=device)
        tokens[at, :model.k] = model.tokens
        if model.q is not None:                  # sampling: a copied row's q is its point mass
            out.q = torch.zeros(b, width, vocab, dtype=model.q.dtype, device=device).scatter_(-1, tokens[..., None], 1.0)
            out.q[at] = _pad(model.q, width)
        if model.top_prob is not None:
            out.top_prob = torch.ones(b, width, dtype=model.top_prob.dtype, device=device)
            out.top_prob[at] = _pad(model.top_prob, width)
    return out.fit(lengths)


def merge_trees(b: int, parts: list[tuple[list[int], TreeProposal]], device) -> TreeProposal:
    """One tree proposal for b rows from parts (rows, their trees in that order), each row's tree
    as it is (a row in no part drafts nothing). Where some part has q, a part without it (a
    copying source's point masses) gets its tokens' one-hot; where some part has hidden states
    or base logits, the others get zeros there (nothing reads them: `Hybrid.observe`)."""
    parents: list[list[int]] = [[] for _ in range(b)]
    for rows, tree in parts:
        for i, par in zip(rows, tree.parents, strict=True):
            parents[i] = par
    width = max((len(p) for p in parents), default=0)
    tokens = torch.zeros(b, width, dtype=torch.long, device=device)
    for rows, tree in parts:
        if tree.width:
            tokens[torch.tensor(rows, device=device), :tree.width] = tree.tokens.to(device)

    def field(name: str, one_hot: bool):
        have = [(rows, getattr(tree, name)) for rows, tree in parts if getattr(tree, name) is not None]
        if not have or width == 0:
            return None
        like = have[0][1]
        out = like.new_zeros(b, width, like.shape[-1])
        if one_hot:
            out.scatter_(-1, tokens[..., None].to(out.device), 1.0)
        for rows, t in have:
            out[torch.tensor(rows, device=out.device)] = _pad(t, width).to(out.device)
        return out
    return TreeProposal(tokens, parents, field("q", True), field("hidden", False), field("base_logits", False))


class Hybrid(DraftPolicy):
    name = "hybrid"
    description = "per row and step: copying (suffix or pld) where its draft scores well, the model draft elsewhere"
    uses_draft_model = True
    configs = (HybridConfig,)

    def __init__(self, copy: DraftPolicy, model: ModelDraftPolicy, cfg: HybridConfig = HybridConfig()) -> None:
        self.cfg = cfg.validate()
        self.copy, self.model = copy, model
        self.copy_name, self.model_name = copy.name, model.name     # the steps' source labels
        assert self.copy_name != self.model_name and NONE not in (self.copy_name, self.model_name)
        self.vocab = model.lm.vocab_size
        self.target_layers = model.target_layers        # an EAGLE head's: the engine records them for it
        self._committed: Rows | None = None
        self._model_prop: Proposal | None = None        # the model source's last proposal, as it made it
        self._model_ix: list[int] = []                  # the rows of the last tree the model source drafted
        self._reset_figures()

    @classmethod
    def build(cls, ctx: MethodContext) -> "Hybrid":
        cfg = ctx.config(HybridConfig).validate()
        # --bank-in / --bank-out belong to the drift method itself (two writers of one file otherwise)
        model_ctx = replace(ctx, configs={**ctx.configs, DriftFiles: DriftFiles()})
        return cls(COPY_SOURCES[cfg.copy].build(ctx), MODEL_SOURCES[cfg.model].build(model_ctx), cfg)

    def _reset_figures(self) -> None:
        self.rate: dict[int, float] = {}                 # slot -> the learned rule's running acceptance
        self._picks: list[_Pick] = []                    # the last proposal's rows
        self.copied_steps = self.model_steps = self.learned_copied = 0

    # -- the sources' shared life cycle ---------------------------------------------------------

    def _sync(self) -> None:
        for src in (self.copy, self.model):
            src.clock, src.slot, src.tree = self.clock, self.slot, self.tree   # the tree: its node budget may move
        self.model.p_min = self.p_min
        self.model.prompt_features = self.prompt_features

    def begin_stream(self) -> None:
        self._reset_figures()
        self.copy.begin_stream()
        self.model.begin_stream()

    def begin_batch(self, slots: int) -> None:
        self.copy.tree = self.model.tree = self.tree
        self.copy.begin_batch(slots)
        self.model.begin_batch(slots)

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        self._sync()
        self.rate[self.slot] = LEARNED_PRIOR
        self.copy.begin_prompt(prompt, tenant)
        self.model.begin_prompt(prompt, tenant)

    def end_prompt(self, output: torch.Tensor) -> None:
        self._sync()
        self.copy.end_prompt(output)
        self.model.end_prompt(output)

    def end_stream(self) -> None:
        self.copy.end_stream()
        self.model.end_stream()

    # -- the choice -----------------------------------------------------------------------------

    def _copies(self, pick: _Pick, slot: int) -> bool:
        n = len(pick.tokens)
        if n == 0:
            return False
        if self.cfg.rule == "length":
            return n >= self.cfg.min_length
        if self.cfg.rule == "learned":
            return expected_accepted(self.rate.get(slot, LEARNED_PRIOR), n) >= self.cfg.min_score
        return pick.score >= self.cfg.min_score

    def _choose(self, context: Rows, gamma: int) -> tuple[list[int], list[_Pick], list[int]]:
        """Each row's copying draft and the rule's choice: (budgets, picks, the model rows)."""
        self._sync()
        budgets = context.budgets(gamma)
        # the copying source's drafts: its own drafting (timed as draft, not as the choice)
        picks = [copying_draft(self.copy, s, n) for s, n in zip(context.slots, budgets, strict=True)]
        with self.clock.span("choose"):
            for pick, s in zip(picks, context.slots, strict=True):
                pick.copy = self._copies(pick, s)
            model_ix = [i for i, (p, n) in enumerate(zip(picks, budgets, strict=True)) if not p.copy and n > 0]
        self._picks = picks
        return budgets, picks, model_ix

    def _labels(self, picks: list[_Pick], budgets: list[int]) -> list[str]:
        return [self.copy_name if p.copy else self.model_name if n > 0 else NONE for p, n in zip(picks, budgets, strict=True)]

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        context = as_rows(context)
        budgets, picks, model_ix = self._choose(context, gamma)
        self._model_prop = model = None
        if model_ix:
            sub = sub_rows(context, model_ix, budgets)
            model = self._model_prop = self.model.propose(sub, max(sub.budget), sampler)
        if model is None:                    # every row copies (or has no budget): the copying proposal
            out = ragged([p.tokens if p.copy else [] for p in picks], context.ids[0].device)
        elif len(model_ix) == len(context):  # every row from the model: its proposal as it is
            out = model
        else:
            with self.clock.span("choose"):
                copied = {i: p.tokens for i, p in enumerate(picks) if p.copy}
                out = merge(len(context), copied, model_ix, model, self.vocab, context.ids[0].device)
        with self.clock.span("choose"):
            out.source = self._labels(picks, budgets)
        for p in picks:
            if p.copy and p.trie:
                self.copy.drafts_from[p.trie] += 1
        return out

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler) -> TreeProposal:
        """The chosen source's tree per row (the choice as for chains), merged into one."""
        if not self.tree.on:
            return super().propose_tree(context, gamma, sampler)
        context = as_rows(context)
        budgets, picks, model_ix = self._choose(context, gamma)
        copy_ix = [i for i, p in enumerate(picks) if p.copy]
        self._model_ix = model_ix
        parts = []
        if copy_ix:                  # the copying source's own trees (it counts their tries itself)
            parts.append((copy_ix, self.copy.propose_tree(sub_rows(context, copy_ix, budgets), gamma, sampler)))
        if model_ix:
            parts.append((model_ix, self.model.propose_tree(sub_rows(context, model_ix, budgets), gamma, sampler)))
        with self.clock.span("choose"):
            if len(parts) == 1 and len(parts[0][0]) == len(context):
                out = parts[0][1]
            else:
                out = merge_trees(len(context), parts, context.ids[0].device)
            out.source = self._labels(picks, budgets)
        return out

    def accept_tree(self, paths: list[list[int]]) -> None:
        """The model source moves its rows' entries (their trees kept their numbering in the merge)."""
        if self._model_ix:
            self.model.accept_tree([paths[i] for i in self._model_ix])

    def commit(self, context: Rows) -> None:
        self._committed = as_rows(context)
        self.copy.commit(context)
        self.model.commit(context)          # a row that copied is behind already: cropping keeps it

    # -- learning -------------------------------------------------------------------------------

    def observe(self, feedback: Feedback) -> None:
        prop, sources = feedback.proposal, feedback.proposal.source
        if not sources:                     # the engine asked nothing of the policy (no draft budget)
            return
        lengths = prop.lengths
        model_ix = [i for i, s in enumerate(sources) if s == self.model_name]
        copy_ix = [i for i, s in enumerate(sources) if s == self.copy_name and lengths[i] > 0]
        self.model_steps += len(model_ix)
        self.copied_steps += sum(s == self.copy_name for s in sources)
        if model_ix:
            if len(model_ix) == len(sources):       # the model's proposal went to verification as it was
                self.model.observe(feedback)
            elif feedback.tree is not None:         # the merged tree's chain view holds its rows' states
                self.model.observe(sub_feedback(feedback, model_ix, select_rows(prop, model_ix),
                                                select_tree(feedback.tree, model_ix)))
            else:                                   # its own proposal, cut as verification cut its rows
                mine = self._model_prop.fit([lengths[i] for i in model_ix])
                self.model.observe(sub_feedback(feedback, model_ix, mine))
        if self.cfg.rule == "learned":
            self._learn_rates(feedback, sources)
        if self.cfg.learn_copied and copy_ix:
            self._learn_copied(feedback, copy_ix)

    def _learn_rates(self, fb: Feedback, sources: list[str]) -> None:
        acc, nxt, lengths = fb.accepted.tolist(), fb.next_token.tolist(), fb.proposal.lengths
        tokens = fb.proposal.tokens.tolist()
        for i, (slot, source) in enumerate(zip(fb.context.slots, sources, strict=True)):
            pick = self._picks[i] if i < len(self._picks) else _Pick()
            if source == self.copy_name and lengths[i] > 0:
                share = acc[i] / lengths[i]
            elif source == self.model_name and pick.tokens:
                # the copying draft held back, against the tokens the target committed
                committed = tokens[i][:acc[i]] + [nxt[i]]
                m = common_prefix(pick.tokens, committed)
                share = 1.0 if m == len(committed) else m / min(len(pick.tokens), m + 1)
            else:
                continue
            self.rate[slot] = (1 - LEARNED_RATE) * self.rate.get(slot, LEARNED_PRIOR) + LEARNED_RATE * share

    def _learn_copied(self, fb: Feedback, ix: list[int]) -> None:
        """The model source's own draft steps over the copied blocks (their tokens forced), then
        its update from the target's distributions there; the draft cache ends at the committed
        rows (this forward is their catch-up)."""
        prop = select_rows(fb.proposal, ix)
        lengths = prop.lengths
        ctx = fb.context
        sub = Rows([ctx.slots[i] for i in ix], [ctx.ids[i] for i in ix], [ctx.tenants[i] for i in ix], lengths)
        p_min, self.model.p_min = self.model.p_min, None
        try:
            forced = self.model.propose(sub, prop.k, _Forced(fb.sampler, prop.tokens))
        finally:
            self.model.p_min = p_min
        self.model.observe(sub_feedback(fb, ix, forced))
        self.learned_copied += len(ix)
        if self._committed is not None:
            ids = [self._committed.ids[i] for i in ix]
            self.model.lm.crop_rows(sub.slots, [len(t) - 1 for t in ids])

    # -- figures --------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        return {
            "config": {"copy": self.cfg.copy, "model": self.cfg.model, "rule": self.cfg.rule,
                       "min_score": self.cfg.min_score, "min_length": self.cfg.min_length,
                       "learn_copied": self.cfg.learn_copied},
            "copied_steps": self.copied_steps,
            "model_steps": self.model_steps,
            "learned_from_copied_steps": self.learned_copied,
            "copy": self.copy.report(),
            "model": self.model.report(),
        }
