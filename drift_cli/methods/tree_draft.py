"""Tree drafting with a draft LM (EAGLE-2's dynamic tree, or a static top-k shape).

Depth by depth, the draft runs one forward over that depth's frontier (all rows together, each
node seeing the committed prefix and its ancestors: a tree mask on the draft's own RowCache):

  1. the frontier's distributions, with the method's adjustment (DRIFT's bias) at every node;
  2. each frontier node draws `--tree-branch` children: greedy, its top-k tokens; sampling, k
     tokens without replacement from the distribution it would draw from (Gumbel top-k, which
     is sequential sampling without replacement, in draw order);
  3. the next frontier: the `--tree-branch` new nodes of highest cumulative draft probability
     (dynamic) or the first ones, breadth first (static).

Greedy: the tree kept is the best `--tree-nodes` nodes, best-first from the root (a node enters
only after its parent and its elder siblings); greedy acceptance is exact for any tree.
Sampling: which siblings the rule tries must not depend on their own drawn values (a sibling kept
because its token scored well is no longer a draw from q), so nothing drawn is dropped: each
family's size is fixed before it is drawn (`--tree-branch`, less where the row's node budget runs
out), and the budget is spent family by family, the frontier chosen as above.

The draft cache keeps the expanded nodes' entries; after verification `accept_tree` moves the accepted path's into place, one gather.

An EAGLE head (`HeadDrafter`) drafts its tree the same way: its cache holds (state, token) pairs,
so a node is fed with the state its parent's position returned (the head's carry; the root's
children read the carry of the last real pair), at position committed + depth - 1 like any node
(`HeadDrafter.forward_nodes`). Those entries were computed from predicted states, so after
verification the head keeps none of them, as after a chain: its real prefix is in place, and
the accepted path's pairs come back real in the next first draft step (`HeadDrafter.keep_rows`).
All positions here are cache slots (`lm.rows.lengths`), which both drafters number alike.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from drift_cli.engine.policy import Rows, as_rows
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import ROOT, TreeProposal, attention


@dataclass
class _Node:
    parent: int                   # index in the row's pool, or ROOT
    token: int
    rank: int                     # among its siblings, in draw order
    score: float                  # cumulative draft log-probability of its path
    depth: int
    state: int                    # the row of its parent's state in the stacked per-depth states
    slot: int | None = None       # the draft cache slot, once fed (expanded)
    kids: list[int] = field(default_factory=list)


@dataclass
class DraftedTree:
    """What the drafter keeps of its last tree for `accept_tree`: per row, the committed slots
    (every tree entry sits after them) and each kept node's cache slot (None: never fed)."""

    base: list[int]
    slots: list[list[int | None]]


def _children(logits: torch.Tensor, k: int, sampler: Sampler):
    """Sampling-space logits [F, V] -> (tokens [F, k], their log-probabilities [F, k], valid [F, k],
    the distributions drawn from [F, V] or None when greedy)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if sampler.greedy:
        keys, probs = logits, None
    else:
        probs = sampler.probs(logits)
        u = torch.rand(probs.shape, generator=sampler.generator, device=probs.device).clamp_(min=1e-20)
        keys = probs.log() - (-u.log()).log()                   # Gumbel top-k: draws without replacement
    top = keys.topk(min(k, keys.shape[-1]), dim=-1).indices
    valid = keys.gather(-1, top) > float("-inf")
    return top, logp.gather(-1, top), valid, probs


def _select(pool: list[_Node], roots: list[int], budget: int, dynamic: bool) -> list[int]:
    """Best-first from the root: the first child enters with the root, each node admits its first
    child and its next sibling. Returns the kept pool indices, parents first."""
    order = (lambda i: (-pool[i].score, i)) if dynamic else (lambda i: (pool[i].depth, i))
    heap = [(*order(roots[0]), roots[0])] if roots else []
    kept: list[int] = []
    while heap and len(kept) < budget:
        *_, i = heapq.heappop(heap)
        kept.append(i)
        node = pool[i]
        siblings = roots if node.parent == ROOT else pool[node.parent].kids
        first_child = node.kids[:1]
        next_sibling = siblings[node.rank + 1:node.rank + 2]
        for nxt in first_child + next_sibling:
            heapq.heappush(heap, (*order(nxt), nxt))
    return sorted(kept, key=lambda i: (pool[i].depth, i))


@torch.inference_mode()
def draft_tree(policy, context: Rows, gamma: int, sampler: Sampler) -> tuple[TreeProposal, DraftedTree]:
    """policy: a ModelDraftPolicy (its `lm`, `tree`, `clock`, `adjust_nodes`)."""
    lm, cfg, clock = policy.lm, policy.tree, policy.clock
    head = hasattr(lm, "forward_nodes")           # an EAGLE head: each node reads its parent's carry
    rows = as_rows(context)
    slots, device = rows.slots, rows.ids[0].device
    feeds = [ids[lm.row_len(s):] for s, ids in zip(slots, rows.ids, strict=True)]
    caps = [n if len(f) else 0 for n, f in zip(rows.budgets(gamma), feeds, strict=True)]
    live = [b for b in range(len(slots)) if caps[b] > 0]
    pools: list[list[_Node]] = [[] for _ in slots]
    roots: list[list[int]] = [[] for _ in slots]
    if not live:
        return _proposal(pools, [[] for _ in slots], [], device), \
            DraftedTree([lm.rows.lengths[s] for s in slots], [[] for _ in slots])
    h, z = lm.forward_rows([slots[b] for b in live], [feeds[b] for b in live])
    last = torch.tensor([len(feeds[b]) - 1 for b in live], device=h.device)
    at = torch.arange(len(live), device=h.device)
    h, z = h[at, last], z[at, last]                                # [F, d], [F, V]: the roots' states
    carry = torch.stack([lm.carry(slots[b]) for b in live]) if head else None   # [F, d]
    base = [lm.rows.lengths[s] for s in slots]                     # the committed cache slots
    frontier = [(b, ROOT) for b in live]
    states: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
    offset = 0
    for depth in range(1, max(caps) + 1):
        logits = sampler.sampling_logits(z)
        with clock.span("adjust"):
            logits = policy.adjust_nodes(h, logits, [b for b, _ in frontier], sampler)
        top, logp, valid, probs = _children(logits, cfg.branch, sampler)
        states.append((h, z, probs, carry))
        toks, lps, oks = top.tolist(), logp.tolist(), valid.tolist()
        new: list[list[int]] = [[] for _ in slots]
        for i, (b, parent) in enumerate(frontier):
            score = 0.0 if parent == ROOT else pools[b][parent].score
            # sampling: a family's size is fixed before its tokens are looked at (its first draws
            # are a sample without replacement of that size), so no drawn sibling is ever dropped
            family = len(toks[i]) if sampler.greedy else min(len(toks[i]), cfg.nodes - len(pools[b]))
            for j in range(family):
                if not oks[i][j]:
                    break
                pools[b].append(_Node(parent, toks[i][j], j, score + lps[i][j], depth, offset + i))
                (roots[b] if parent == ROOT else pools[b][parent].kids).append(len(pools[b]) - 1)
                new[b].append(len(pools[b]) - 1)
        offset += len(frontier)
        expand = [(b, ix) for b in live if depth < caps[b] and (sampler.greedy or len(pools[b]) < cfg.nodes)
                  for ix in (sorted(new[b], key=lambda ix: -pools[b][ix].score) if cfg.shape == "dynamic"
                             else new[b])[:cfg.branch]]
        if not expand:
            break
        carries = torch.cat([st[3] for st in states]) if head else None   # per node state row: its carry
        h, z, carry = _expand(lm, slots, pools, base, expand, carries)
        frontier = expand
    if sampler.greedy:        # greedy acceptance holds for any tree: keep the best N (EAGLE-2's rerank)
        kept = [_select(pools[b], roots[b], cfg.nodes, cfg.shape == "dynamic") for b in range(len(slots))]
    else:                     # sampling: every drawn node, the budget was spent family by family
        kept = [sorted(range(len(pool)), key=lambda i, pool=pool: (pool[i].depth, i)) for pool in pools]
    drafted = DraftedTree(base, [[pools[b][i].slot for i in keep] for b, keep in enumerate(kept)])
    return _proposal(pools, kept, states, device), drafted


def _expand(lm, slots: list[int], pools: list[list[_Node]], base: list[int], expand: list[tuple[int, int]],
            carries: torch.Tensor | None):
    """Feed the nodes to expand (row by row) through the draft with the tree mask; returns their
    states (hidden [F, d], logits [F, V], and a head's carry [F, d] or None) in `expand`'s order.
    carries: a head's, per stacked state row (a node reads its parent's: `_Node.state`)."""
    fed = sorted({b for b, _ in expand})
    per_row = {b: [ix for bb, ix in expand if bb == b] for b in fed}
    starts = [lm.rows.lengths[slots[b]] for b in fed]
    seen, positions, feeds = [], [], []
    for b, start in zip(fed, starts, strict=True):
        row_seen, row_pos = [], []
        for j, ix in enumerate(per_row[b]):
            node = pools[b][ix]
            node.slot = start + j
            ancestors, p = [], node.parent
            while p != ROOT:
                ancestors.append(pools[b][p].slot)
                p = pools[b][p].parent
            row_seen.append(ancestors + [node.slot])
            row_pos.append(base[b] - 1 + node.depth)
        seen.append(row_seen)
        positions.append(row_pos)
        feeds.append(torch.tensor([pools[b][ix].token for ix in per_row[b]], dtype=torch.long))
    width = max(len(f) for f in feeds)
    device = lm.device
    attend = attention(starts, [base[b] for b in fed], seen, positions, width, device)
    feeds = [f.to(device) for f in feeds]
    if carries is None:
        h, z = lm.forward_rows([slots[b] for b in fed], feeds, attend=attend)
        c = None
    else:
        g = carries.new_zeros(len(fed), width, carries.shape[-1])      # padding reads zeros, rolled back
        for r, b in enumerate(fed):
            g[r, :len(per_row[b])] = carries[torch.tensor([pools[b][ix].state for ix in per_row[b]],
                                                          device=carries.device)]
        h, z, c = lm.forward_nodes([slots[b] for b in fed], feeds, g, attend)
    where = {(b, ix): (r, j) for r, b in enumerate(fed) for j, ix in enumerate(per_row[b])}
    r = torch.tensor([where[e][0] for e in expand], device=h.device)
    j = torch.tensor([where[e][1] for e in expand], device=h.device)
    return h[r, j], z[r, j], None if c is None else c[r, j]


def _proposal(pools: list[list[_Node]], kept: list[list[int]], states, device) -> TreeProposal:
    """The kept nodes as a TreeProposal: tokens, parents renumbered, and per node its parent's
    state (hidden, raw logits, the distribution it was drawn from)."""
    width = max((len(k) for k in kept), default=0)
    parents, tokens, index = [], [], []
    for pool, keep in zip(pools, kept, strict=True):
        new = {old: i for i, old in enumerate(keep)}
        parents.append([ROOT if pool[i].parent == ROOT else new[pool[i].parent] for i in keep])
        tokens.append([pool[i].token for i in keep] + [0] * (width - len(keep)))
        index.append([pool[i].state for i in keep] + [0] * (width - len(keep)))
    tok = torch.tensor(tokens, dtype=torch.long, device=device).view(len(kept), width)
    if width == 0 or not states:
        return TreeProposal(tok, parents)
    ix = torch.tensor(index, dtype=torch.long, device=states[0][0].device)
    stack = lambda k: None if states[0][k] is None else torch.cat([s[k] for s in states])[ix]  # noqa: E731
    return TreeProposal(tok, parents, q=stack(2), hidden=stack(0), base_logits=stack(1))
