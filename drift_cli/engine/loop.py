"""The one speculative decoding loop that every method runs through.

B slots decode together (continuous batching; B = 1 is one slot). Per iteration, for the active
rows in slot order:
  1. draft:  the policy proposes a ragged block: row b drafts num_draft[b] <= its budget
             (`draft_budget`: γ, less near the generation budget; 0 for `ar`, or when pld finds
             no match)
  2. verify: the target scores every row's [last, x1..xk] in one forward pass and the exact
             acceptance rule picks each row's accepted prefix and correction/bonus token
  3. roll back both KV caches, row by row, to the committed sequences (never re-prefill)
  4. adapt:  the policy observes the feedback of all rows at once (rows in slot order)
  5. a StepRecord per row with its share of the iteration's time split draft / verify / adapt /
     other; on CUDA the clock syncs once, at the iteration boundary (the acceptance decision
     needs one host read anyway).
Then every finished row (EOS or budget) hands its slot to the next prompt of the stream, in
stream order, with a prefill of that row only, before the next iteration.

Cache invariant for the target: each row holds its committed sequence minus its last token.

A policy that asks for target features (`DraftPolicy.target_layers`) gets them out of these same
passes (`CausalLM.capture`): the prefill's at admission, the verification's in the commit and the
feedback. No target pass is added for them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import torch

from drift_cli import interrupt
from drift_cli.engine.acceptance import accept_greedy, accept_sampling, accept_tree_greedy, accept_tree_sampling
from drift_cli.engine.gamma import CostProfile, GammaConfig, GammaController, controller as gamma_controller
from drift_cli.engine.graphs import prepare_policy
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.timing import IterationClock
from drift_cli.engine.policy import DraftPolicy, Feedback, Proposal, Rows, TreeStep
from drift_cli.engine import tree as trees
from drift_cli.engine.tree import TreeConfig, TreeProposal
from drift_cli.stream import Stream


@dataclass
class DecodeConfig:
    gamma: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float | None = None
    eos_id: int | None = None
    seed: int = 0
    batch_size: int = 1          # slots decoded together (continuous batching)
    gamma_policy: GammaConfig = GammaConfig()   # --gamma caps the adaptive policies
    cost_profile: CostProfile | None = None     # the cost controller's measured costs
    tree: TreeConfig = TreeConfig()             # --tree-nodes: token trees (γ caps their depth); off: chains

    def controller(self) -> GammaController:
        """A fresh γ controller (one per stream)."""
        return gamma_controller(self.gamma_policy, self.gamma, self.cost_profile, self.tree.nodes, self.tree.branch)


@dataclass
class StepRecord:
    """One row of one iteration. The times are the row's share of the iteration's (the
    iteration's divided by its rows), so that they sum to the stream's decode time."""

    prompt: int                  # index of the prompt in the stream
    step: int                    # verification step (iteration) index within the stream
    drafted: int
    accepted: int
    emitted: int                 # tokens committed by this iteration (accepted + 1, less after EOS)
    total_ms: float
    draft_ms: float
    verify_ms: float
    adapt_ms: float
    other_ms: float
    adjust_ms: float             # the method's logit adjustment, inside draft_ms
    forward_draft_ms: float      # draft model forward passes, inside draft_ms
    forward_target_ms: float     # target forward pass, inside verify_ms
    target_entropy: list[float] = field(default_factory=list)  # nats, per drafted position (T = 1)
    slot: int = 0                # the row's slot
    batch: int = 1               # rows in the iteration
    gamma: int = 0               # the γ the controller chose (before the generation-budget cut)
    source: str = ""             # which source proposed the row (`hybrid`: its copying or model source, or
    #                              "none" with no draft budget); "" for a single-source method
    choose_ms: float = 0.0       # `hybrid` choosing the row's source (the rule, the merge of the two
    #                              sources' proposals, the labels), inside draft_ms
    # trees (--tree-nodes; 0 / empty for chains): the tree's nodes, the sibling rank of each accepted
    # node (depth 1 first), and how many children of the last accepted node (or the root) were tried,
    # all rejected. With trees, `drafted` and `accepted` are along the accepted path (its chain view).
    nodes: int = 0
    ranks: list[int] = field(default_factory=list)
    tried: int = 0
    node_budget: int = 0         # trees: the iteration's node budget (--tree-nodes, or the cost controller's choice)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    prompt_index: int
    prompt_ids: list[int]
    output_ids: list[int]
    steps: list[StepRecord]
    prefill_ms: float
    hit_eos: bool
    admitted_ms: float = 0.0     # when the prompt took its slot, ms since the stream started
    finished_ms: float = 0.0     # when its last token was committed, ms since the stream started

    @property
    def decode_ms(self) -> float:
        return sum(s.total_ms for s in self.steps)

    @property
    def latency_ms(self) -> float:
        """Admission to finish (the prefill and every iteration the row was in)."""
        return self.finished_ms - self.admitted_ms


def draft_budget(gamma: int, max_new_tokens: int, produced: int) -> int:
    """Tokens a row may draft in the next iteration: at most γ, and never past its generation
    budget (the iteration also emits the target's correction or bonus token). 0 or less: nothing."""
    return min(gamma, max_new_tokens - produced - 1)


def _cut_at_eos(proposal: Proposal, eos_id: int | None) -> Proposal:
    """Drafting past an EOS is pointless: keep each row's drafts up to and including its first EOS."""
    if eos_id is None or proposal.k == 0:
        return proposal
    lengths = proposal.lengths
    if len(lengths) == 1:                 # batch 1: one device read, as it always was
        hits = (proposal.tokens[0] == eos_id).nonzero()
        return proposal.truncate(int(hits[0]) + 1) if len(hits) else proposal
    cut = []
    for row, n in zip(proposal.tokens.tolist(), lengths, strict=True):
        cut.append(next((i + 1 for i, t in enumerate(row[:n]) if t == eos_id), n))
    return proposal if cut == lengths else proposal.fit(cut)


def _entropy(logits: torch.Tensor) -> list[float]:
    """logits [k, V] -> entropy in nats per row (temperature 1)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def verify(target: CausalLM, context: Rows, proposal: Proposal, sampler: Sampler):
    """Score each row's [last, x1..xk] with the target and apply the acceptance rule.

    Returns (target_hidden [B, k+1, d], target_logits [B, k+1, V], accepted [B], next_token [B],
    target_features [B, k+1, F] or None when the target records none); row b's distributions are
    at [b, 0..num_draft[b]] (past them: copies of its last one).
    """
    k = proposal.k
    if target.rows is None:               # batch 1
        feed = torch.cat([context.ids[0][target.cache_len:], proposal.tokens[0]])[None]
        hidden, logits = target.forward(feed)
        hidden, logits = hidden[:, -(k + 1):], logits[:, -(k + 1):]
        features = None if target.features is None else target.features[:, -(k + 1):]
    else:
        lengths = proposal.lengths
        feeds = [torch.cat([ids[target.row_len(s):], proposal.tokens[b, :lengths[b]]])
                 for b, (s, ids) in enumerate(zip(context.slots, context.ids, strict=True))]
        hidden, logits = target.forward_rows(context.slots, feeds)
        fed = torch.tensor([len(f) for f in feeds], device=logits.device)
        drafted = torch.tensor(lengths, device=logits.device)
        at = (fed - 1 - drafted)[:, None] + torch.arange(k + 1, device=logits.device)      # [B, k+1]
        at = torch.minimum(at, (fed - 1)[:, None])
        rows = torch.arange(len(feeds), device=logits.device)[:, None]
        hidden, logits = hidden[rows, at], logits[rows, at]
        features = None if target.features is None else target.features[rows, at]
    if sampler.greedy:
        accepted, next_token = accept_greedy(proposal.tokens, logits, proposal.num_draft)
    else:
        p = sampler.probs(sampler.sampling_logits(logits))
        accepted, next_token = accept_sampling(proposal.tokens, proposal.q, p, sampler.generator, proposal.num_draft)
    return hidden, logits, accepted, next_token, features


def verify_tree(target: CausalLM, context: Rows, tree: TreeProposal, sampler: Sampler):
    """Score every row's [committed tokens the cache lacks, tree nodes] in one pass (each node sees
    the committed prefix and its ancestors) and apply the tree rule; then one gather moves the
    accepted path's entries into place in the target's cache.

    Returns (target_hidden [B, N+1, d], target_logits [B, N+1, V] (0: the root, i + 1: node i),
    paths, next_token [B], target_features [B, N+1, F] or None)."""
    n = tree.width
    starts = [target.row_len(s) for s in context.slots]
    prefix = [len(ids) - s for s, ids in zip(starts, context.ids, strict=True)]
    feeds = [torch.cat([ids[s:], tree.tokens[b, :len(par)]])
             for b, (s, ids, par) in enumerate(zip(starts, context.ids, tree.parents, strict=True))]
    width = max(len(f) for f in feeds)
    attend = trees.verify_attention(starts, prefix, tree.parents, width, target.device)
    hidden, logits = target.forward_rows(context.slots, feeds, attend=attend)
    at = torch.tensor([[f - 1] + [f + i if i < len(par) else f - 1 for i in range(n)]
                       for f, par in zip(prefix, tree.parents, strict=True)], device=logits.device)   # [B, N+1]
    rows = torch.arange(len(feeds), device=logits.device)[:, None]
    hidden, logits = hidden[rows, at], logits[rows, at]
    features = None if target.features is None else target.features[rows, at]
    if sampler.greedy:
        paths, next_token = accept_tree_greedy(tree.tokens, tree.parents, logits)
    else:
        p = sampler.probs(sampler.sampling_logits(logits))
        paths, next_token = accept_tree_sampling(tree.tokens, tree.parents, tree.q, p, sampler.generator)
    committed = [s + f for s, f in zip(starts, prefix, strict=True)]      # the row's slots after the prefix
    target.keep_rows(context.slots, [[c + i for i in path] for c, path in zip(committed, paths, strict=True)], committed)
    return hidden, logits, paths, next_token, features


def along_paths(tree: TreeProposal, paths: list[list[int]], hidden: torch.Tensor, logits: torch.Tensor,
                features: torch.Tensor | None):
    """The chain view of a verified tree (`drift_cli.engine.tree.chain_view`): a Proposal of each
    row's accepted path and first rejected candidate, with the target's hidden states, logits and
    features at [root, those nodes] and accepted [B], as `verify` returns them for a chain."""
    views = [trees.chain_view(par, path) for par, path in zip(tree.parents, paths, strict=True)]
    m = max((len(v) for v in views), default=0)
    device = logits.device
    accepted = torch.tensor([len(p) for p in paths], dtype=torch.long)
    scored = torch.tensor([[0] + [i + 1 for i in v] + [v[-1] + 1 if v else 0] * (m - len(v)) for v in views],
                          device=device)                                            # [B, m+1]
    rows = torch.arange(len(views), device=device)[:, None]
    at = lambda t: t[rows, scored]  # noqa: E731
    if m == 0:
        prop = Proposal(tree.tokens[:, :0], source=tree.source)
    else:
        nodes = scored[:, 1:] - 1
        pick = lambda t: None if t is None else t[rows, nodes]  # noqa: E731
        lengths = [len(v) for v in views]
        prop = Proposal(pick(tree.tokens), pick(tree.q), pick(tree.hidden), pick(tree.base_logits),
                        source=tree.source).fit(lengths)
    return prop, at(hidden), at(logits), accepted.to(device), None if features is None else at(features)


@dataclass
class _Row:
    """A slot's prompt while it decodes."""

    index: int
    prompt_ids: list[int]
    tenant: str | None
    ids: torch.Tensor                          # committed ids [L]
    prefill_ms: float
    admitted_ms: float
    steps: list[StepRecord] = field(default_factory=list)
    produced: int = 0
    hit_eos: bool = False


class Decoder:
    """Continuous batching of one policy over a sequence of prompts; adaptive state persists.

    The order adaptive state sees: iteration by iteration; inside an iteration, one `observe`
    with all rows in slot order; rows that finish end (`end_prompt`) in slot order, then the
    freed slots take the next prompts in stream order (lowest slot first).
    """

    def __init__(self, target: CausalLM, policy: DraftPolicy, cfg: DecodeConfig, sampler: Sampler,
                 controller: GammaController | None = None, t0: float | None = None) -> None:
        self.target, self.policy, self.cfg, self.sampler = target, policy, cfg, sampler
        self.clock = IterationClock(target.device)
        target.clock = self.clock
        policy.clock = self.clock
        # one γ for every row of an iteration; it learns from the rows in slot order
        self.controller = controller or cfg.controller()
        policy.p_min = self.controller.p_min
        self.t0 = time.perf_counter() if t0 is None else t0

    def _now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def admit(self, slot: int, index: int, prompt_ids, tenant: str | None) -> _Row:
        """The prompt takes the slot: a prefill of that row only."""
        target, device = self.target, self.target.device
        ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
        admitted = self._now_ms()
        t0 = time.perf_counter()
        target.reset_row(slot)
        if len(ids) > 1:
            target.forward_rows([slot], [ids[:-1]])
        self.policy.slot = slot
        if target.capture_layers:
            self.policy.prompt_features = target.features[0] if len(ids) > 1 else None
        self.policy.begin_prompt(ids[None], tenant)
        self.clock.read()
        return _Row(index, list(prompt_ids), tenant, ids, (time.perf_counter() - t0) * 1e3, admitted)

    def run(self, prompts, out: list[Generation], step0: int = 0, on_done=None) -> int:
        """Decode prompts [(stream index, ids, tenant)], appending each finished Generation to
        `out` (in finishing order; a KeyboardInterrupt leaves the finished ones there). Returns
        the next step index."""
        cfg, policy, target = self.cfg, self.policy, self.target
        prompts = list(prompts)
        target.capture(tuple(policy.target_layers))     # () for every drafter that reads no target state
        try:
            return self._run(prompts, out, step0, on_done)
        finally:
            target.capture(())

    def _run(self, prompts: list, out: list[Generation], step0: int, on_done) -> int:
        cfg, policy, target = self.cfg, self.policy, self.target
        b = max(1, min(cfg.batch_size, len(prompts)))   # slots beyond the prompts would stay empty
        target.reset_rows(b, row_cache=cfg.tree.on)
        policy.tree = cfg.tree
        policy.begin_batch(b)
        queue = iter(prompts)
        slots: list[_Row | None] = [None] * b
        for s in range(b):
            nxt = next(queue, None)
            if nxt is not None:
                slots[s] = self.admit(s, *nxt)
        step = step0
        while any(r is not None for r in slots):
            interrupt.check()   # a Ctrl-C / SIGTERM that landed in a finaliser is raised here
            active = [s for s, r in enumerate(slots) if r is not None]
            rows = [slots[s] for s in active]
            self.iteration(active, rows, step)
            step += 1
            for s, row in zip(active, rows, strict=True):
                if row.produced >= cfg.max_new_tokens or row.hit_eos:
                    out.append(self.finish(s, row))
                    if on_done is not None:
                        on_done(len(out))
                    nxt = next(queue, None)
                    slots[s] = None if nxt is None else self.admit(s, *nxt)
        return step

    def finish(self, slot: int, row: _Row) -> Generation:
        output = row.ids[len(row.prompt_ids):]
        self.policy.slot = slot
        self.policy.end_prompt(output[None])
        return Generation(row.index, row.prompt_ids, output.tolist(), row.steps, row.prefill_ms, row.hit_eos,
                          row.admitted_ms, self._now_ms())

    def _tree_step(self, context: Rows, budget: list[int], room: int):
        """Draft a tree per row, verify all rows' nodes in one target pass, and move the accepted
        paths' cache entries into place (the target's here, the drafter's in `accept_tree`).
        Returns (the chain view's proposal, the TreeStep, verify's results along the chain view)."""
        policy, sampler, clock = self.policy, self.sampler, self.clock
        with clock.span("draft"):
            if room > 0:
                tree = policy.propose_tree(context, room, sampler)
            else:
                tree = TreeProposal(context.ids[0].new_zeros(len(context), 0), [[] for _ in context.slots])
            tree, kept = trees.fit(tree, [max(0, m) for m in budget], self.cfg.eos_id)
        with clock.span("verify"):
            hidden, logits, paths, next_token, features = verify_tree(self.target, context, tree, sampler)
            proposal, *scored = along_paths(tree, paths, hidden, logits, features)
        if room > 0:                      # the paths in the drafter's own numbering
            policy.accept_tree(paths if kept is None else [[k[i] for i in p] for k, p in zip(kept, paths, strict=True)])
        target_hidden, target_logits, accepted, features = scored
        return proposal, TreeStep(tree, logits, paths), (target_hidden, target_logits, accepted, next_token, features)

    def iteration(self, active: list[int], rows: list[_Row], step: int) -> None:
        cfg, policy, target, sampler, clock = self.cfg, self.policy, self.target, self.sampler, self.clock
        t_start = time.perf_counter()
        gamma = self.controller.next_gamma()
        if cfg.tree.on and (nodes := self.controller.next_nodes() or cfg.tree.nodes) != policy.tree.nodes:
            policy.tree = replace(cfg.tree, nodes=nodes)      # the cost controller's node budget
        budget = [draft_budget(gamma, cfg.max_new_tokens, r.produced) for r in rows]
        context = Rows(active, [r.ids for r in rows], [r.tenant for r in rows], budget)
        room = max(budget)
        if cfg.tree.on:
            proposal, tree, (target_hidden, target_logits, accepted, next_token, features) = \
                self._tree_step(context, budget, room)
            acc = accepted.tolist()
        else:
            tree = None
            with clock.span("draft"):
                proposal = policy.propose(context, room, sampler) if room > 0 else DraftPolicy.propose(policy, context, 0, sampler)
                lengths = proposal.lengths
                fitted = [min(n, max(0, m)) for n, m in zip(lengths, budget, strict=True)]
                if fitted != lengths:
                    proposal = proposal.fit(fitted)
                proposal = _cut_at_eos(proposal, cfg.eos_id)
            with clock.span("verify"):
                target_hidden, target_logits, accepted, next_token, features = verify(target, context, proposal, sampler)
                acc = accepted.tolist()  # the one host read per iteration
        drafted, nxt = proposal.lengths, next_token.tolist()
        tokens = proposal.tokens.tolist() if proposal.k else [[] for _ in rows]
        new_ids, emitted = [], []
        for r, row in enumerate(rows):
            new = tokens[r][:acc[r]] + [nxt[r]]
            if cfg.eos_id is not None and cfg.eos_id in new:
                new = new[: new.index(cfg.eos_id) + 1]
                row.hit_eos = True
            emitted.append(len(new))
            new_ids.append(torch.cat([row.ids, torch.tensor(new, dtype=torch.long, device=row.ids.device)]))
        target.crop_rows(active, [len(ids) - 1 for ids in new_ids])
        # the states the target scored at newly committed positions: [last, accepted drafts]
        scored = None if features is None else [features[r, :emitted[r]] for r in range(len(rows))]
        policy.commit(context.with_ids(new_ids, scored))
        with clock.span("adapt"):
            policy.observe(Feedback(context, proposal, target_logits, accepted, next_token, sampler, step, target_hidden,
                                    features, tree))
        ms = clock.read()
        share = 1.0 / len(rows)
        total = (time.perf_counter() - t_start) * 1e3
        phases = {name: ms.get(name, 0.0) for name in ("draft", "verify", "adapt")}
        split = dict(total_ms=total, draft_ms=phases["draft"], verify_ms=phases["verify"], adapt_ms=phases["adapt"],
                     other_ms=max(0.0, total - sum(phases.values())), adjust_ms=ms.get("adjust", 0.0),
                     forward_draft_ms=ms.get("forward_draft", 0.0), forward_target_ms=ms.get("forward_target", 0.0),
                     choose_ms=ms.get("choose", 0.0))
        if share != 1.0:
            split = {name: v * share for name, v in split.items()}
        records = []
        sources = proposal.source or [""] * len(rows)
        for r, row in enumerate(rows):
            records.append(StepRecord(
                prompt=row.index, step=step, drafted=drafted[r], accepted=acc[r], emitted=emitted[r], **split,
                # instrumentation, outside the timed iteration:
                target_entropy=_entropy(target_logits[r, : drafted[r]]) if drafted[r] else [],
                slot=active[r], batch=len(rows), gamma=gamma, source=sources[r], **_tree_record(tree, r),
                node_budget=policy.tree.nodes if tree is not None else 0))
            row.steps.append(records[-1])
            row.ids = new_ids[r]
            row.produced += emitted[r]
        # the controller learns from the records, rows in slot order; its time is added to them
        t_ctl = time.perf_counter()
        top = proposal.top_prob.tolist() if proposal.top_prob is not None else None
        for r, record in enumerate(records):
            self.controller.observe(drafted[r], acc[r], top[r][: drafted[r]] if top is not None else [], record)
        ctl_ms = (time.perf_counter() - t_ctl) * 1e3 * share
        for record in records:
            record.total_ms += ctl_ms
            record.other_ms += ctl_ms


def _tree_record(tree: TreeStep | None, r: int) -> dict:
    """Row r's tree figures for its StepRecord (nothing for a chain)."""
    if tree is None:
        return {}
    parents, path = tree.proposal.parents[r], tree.paths[r]
    ranks = trees.sibling_ranks(parents)
    last = path[-1] if path else trees.ROOT
    return dict(nodes=len(parents), ranks=[ranks[i] for i in path], tried=len(trees.children(parents)[last + 1]))


def generate(
    target: CausalLM,
    policy: DraftPolicy,
    prompt_ids: list[int] | tuple[int, ...],
    cfg: DecodeConfig,
    sampler: Sampler,
    *,
    prompt_index: int = 0,
    step0: int = 0,
    tenant: str | None = None,
    controller: GammaController | None = None,
) -> Generation:
    """Generate up to cfg.max_new_tokens after one prompt (batch size 1). controller: the
    stream's γ controller (default: a fresh one from cfg)."""
    out: list[Generation] = []
    one = replace(cfg, batch_size=1)
    Decoder(target, policy, one, sampler, controller).run([(prompt_index, prompt_ids, tenant)], out, step0)
    return out[0]


@dataclass
class StreamRun:
    method: str
    generations: list[Generation]
    complete: bool
    report: dict
    wall_ms: float = 0.0         # the whole stream: prefills, iterations, admissions
    batch_size: int = 1
    cost_profile: CostProfile | None = None   # the stream's measured costs (DecodeConfig.cost_profile)
    warmup_ms: float = 0.0       # graph capture for this policy before the stream (untimed; 0 on the eager path)

    @property
    def steps(self) -> list[StepRecord]:
        return [s for g in self.generations for s in g.steps]


def run_stream(
    target: CausalLM,
    policy: DraftPolicy,
    stream: Stream,
    cfg: DecodeConfig,
    *,
    on_prompt=None,
    switch: tuple[int, CausalLM] | None = None,
) -> StreamRun:
    """Run every prompt of a stream through one policy, cfg.batch_size rows at a time, prompts
    admitted in stream order; adaptive state persists. Generations come back in stream order.

    switch (N, target B): prompts N, N+1, ... are verified by target B (a target-change stream;
    the policy's state and the γ controller carry over). A KeyboardInterrupt stops the stream
    and returns what finished, marked incomplete.
    """
    gen = torch.Generator(device=target.device).manual_seed(cfg.seed)
    sampler = Sampler(cfg.temperature, cfg.top_p, gen)
    # CUDA graphs of this policy's draft (and the target's widths) are captured here, untimed
    slots = max(1, min(cfg.batch_size, len(stream.prompts)))
    warmup = sum(prepare_policy(lm, policy, slots, cfg.gamma) for lm in [target] + ([switch[1]] if switch else []))
    policy.begin_stream()
    controller = cfg.controller() if policy.drafts else GammaController(0)
    out: list[Generation] = []
    complete = True
    total = len(stream.prompts)
    t0 = time.perf_counter()
    # on_prompt(prompts done, total, output tokens so far): the progress line's tokens/s
    tick = (lambda done: on_prompt(done, total, sum(len(g.output_ids) for g in out))) if on_prompt is not None else None
    if tick is not None:
        tick(0)                                   # the stream's start: progress times it from here
    try:
        parts = [(target, list(enumerate(stream.prompts)))]
        if switch is not None:                      # the rows drain before the new target takes over
            parts = [(target, parts[0][1][:switch[0]]), (switch[1], parts[0][1][switch[0]:])]
        step = 0
        for active, prompts in parts:
            decoder = Decoder(active, policy, cfg, sampler, controller, t0=t0)
            step = decoder.run([(i, p.ids, p.tenant) for i, p in prompts], out, step, on_done=tick)
    except KeyboardInterrupt:
        complete = False
    wall = (time.perf_counter() - t0) * 1e3
    policy.end_stream()
    out.sort(key=lambda g: g.prompt_index)
    report = policy.report()
    if cfg.gamma_policy.policy != "fixed" and policy.drafts:
        report = {**report, "gamma_controller": {"policy": controller.name, **controller.report()}}
    return StreamRun(policy.name, out, complete, report, wall, max(1, cfg.batch_size), cfg.cost_profile, warmup)
