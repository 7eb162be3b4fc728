"""Token trees: what a tree proposal is, and everything derived from its parents, in one place.

A row's tree is data: its node tokens, a parent index per node (`ROOT` for the children of the
row's last committed token) and, derived from those, a depth per node (1 for the root's
children), each node's children in sibling order, the root-to-node path. Nodes are stored
parents-first (parent index < own index), siblings in the order they were drawn. A chain of k
drafts is the tree whose parents are ROOT, 0, 1, ..., k-2 (`chain_parents`).

The attention a tree needs is derived here too (`attention`): a query sees the committed prefix,
its ancestors and itself, at position committed length + depth - 1 (the root being the last
committed token). Both the target's verification pass and the draft's per-depth expansion feed
their tree nodes through `CausalLM.forward_rows(..., attend=...)`, the RowCache 4D-mask path;
after acceptance one gather per cache (`CausalLM.keep_rows`) moves the accepted path's keys and
values into place. Nothing is re-prefilled.

`--tree-nodes N` asks for trees of at most N nodes per row, `--gamma` capping their depth;
0 (the default) keeps chains and the chain code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from drift_cli.knobs import Settings, at_least, between, knob

if TYPE_CHECKING:
    import torch

ROOT = -1
TREE_SHAPES = ("dynamic", "static")
TREE_LEARN = ("path", "all")


@dataclass(frozen=True)
class TreeConfig(Settings):
    nodes: int = knob(0, "--tree-nodes", "draft a token tree of at most this many nodes per row (0: a chain); "
                      "--gamma caps its depth", ok=between(0, 256), kind=int, rule="must be in [0, 256]")
    shape: str = knob("dynamic", "--tree-shape", "dynamic (EAGLE-2: keep the nodes of highest cumulative draft "
                      "probability) or static (top-k children per node, breadth first)", choices=TREE_SHAPES)
    branch: int = knob(4, "--tree-branch", "children drawn per expanded node, and nodes expanded per depth",
                       ok=at_least(1), kind=int, rule="must be >= 1")
    learn: str = knob("path", "--tree-learn", "drift on trees: the bank learns from the accepted path's states "
                      "(path) or from every state the target scored (all)", choices=TREE_LEARN)

    @property
    def on(self) -> bool:
        return self.nodes > 0


@dataclass
class TreeProposal:
    """Ragged per-row trees: row b's nodes are its first num_nodes[b] (the rest padding)."""

    tokens: torch.Tensor                 # [B, N] int64
    parents: list[list[int]]             # per row, per node: its parent's index, or ROOT
    q: torch.Tensor | None = None        # [B, N, V] the distribution each node was drawn from, before its
    #                                      elder siblings were removed (drawn without replacement); None:
    #                                      point masses (greedy drafts, model-free drafters)
    hidden: torch.Tensor | None = None   # [B, N, d] the draft state whose head drew the node (its parent's)
    base_logits: torch.Tensor | None = None  # [B, N, V] raw draft logits at the node's parent
    source: list[str] | None = None      # per row: which source proposed it (`hybrid`)

    @property
    def num_nodes(self) -> list[int]:
        return [len(p) for p in self.parents]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


def chain_parents(k: int) -> list[int]:
    """The parents of a chain of k drafts: ROOT, 0, 1, ..., k-2."""
    return [ROOT] + list(range(k - 1))


def depths(parents: list[int]) -> list[int]:
    """Depth per node: 1 for the root's children."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p == ROOT else out[p] + 1)
    return out


def children(parents: list[int]) -> list[list[int]]:
    """[0]: the root's children, [i + 1]: node i's, each in sibling order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out


def sibling_ranks(parents: list[int]) -> list[int]:
    """Each node's rank among its siblings (0: the first drawn)."""
    seen: dict[int, int] = {}
    out = []
    for p in parents:
        out.append(seen.get(p, 0))
        seen[p] = out[-1] + 1
    return out


def path_to(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (the leaf-to-root retrieve indices, reversed)."""
    path = []
    while node != ROOT:
        path.append(node)
        node = parents[node]
    return path[::-1]


def prune_after(tokens: list[int], parents: list[int], stop: int) -> list[int]:
    """The nodes to keep when nothing is drafted after a `stop` token (EOS): every node none of whose
    proper ancestors is `stop`, in order."""
    dead = [False] * len(parents)
    keep = []
    for i, p in enumerate(parents):
        dead[i] = p != ROOT and (dead[p] or tokens[p] == stop)
        if not dead[i]:
            keep.append(i)
    return keep


def subtree(parents: list[int], keep: list[int]) -> list[int]:
    """The parents of the nodes `keep` (closed under parents, in order), renumbered."""
    new = {old: i for i, old in enumerate(keep)}
    return [ROOT if parents[old] == ROOT else new[parents[old]] for old in keep]


@dataclass
class Attention:
    """What `CausalLM.forward_rows` needs to feed a tree: rotary positions [R, S] and the
    visibility [R, S, kv_len] of each query over the row's cache slots."""

    positions: torch.Tensor
    visible: torch.Tensor


def attention(start: list[int], committed: list[int], seen: list[list[list[int]]], positions: list[list[int]],
              width: int, device) -> Attention:
    """Row r writes its queries j at cache slots start[r] + j. Query j sees every slot below
    committed[r] and the slots seen[r][j] (its ancestors' and its own), at rotary position
    positions[r][j]. Padding queries (j >= len(seen[r])) see the committed prefix and themselves."""
    import torch

    kv_len = max(start) + width
    visible = torch.zeros(len(start), width, kv_len, dtype=torch.bool)
    pos = torch.zeros(len(start), width, dtype=torch.long)
    for r, (s, c) in enumerate(zip(start, committed, strict=True)):
        visible[r, :, :c] = True
        n = len(seen[r])
        for j, slots in enumerate(seen[r]):
            visible[r, j, slots] = True
        pos[r, :n] = torch.tensor(positions[r], dtype=torch.long)
        last = positions[r][-1] if n else c
        for j in range(n, width):                                 # padding: computed, then rolled back
            visible[r, j, s + j] = True
            pos[r, j] = last
    return Attention(pos.to(device), visible.to(device))


def verify_attention(start: list[int], prefix: list[int], parents: list[list[int]], width: int, device) -> Attention:
    """The target's verification feed of row r: prefix[r] committed tokens the cache lacks (the last
    one is the tree's root) then the row's nodes. The prefix is causal; node i sees the prefix, its
    ancestors and itself, at position start + prefix - 1 + depth."""
    seen, positions = [], []
    for s, f, par in zip(start, prefix, parents, strict=True):
        row_seen = [list(range(s, s + j + 1)) for j in range(f)]
        row_pos = [s + j for j in range(f)]
        for i, (p, d) in enumerate(zip(par, depths(par), strict=True)):
            row_seen.append((row_seen[f - 1] if p == ROOT else row_seen[f + p]) + [s + f + i])
            row_pos.append(s + f - 1 + d)
        seen.append(row_seen)
        positions.append(row_pos)
    return attention(start, start, seen, positions, width, device)


def merge_paths(paths: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """Token paths (best first) as one tree sharing their common prefixes: (tokens, parents), at
    most max_nodes nodes (a path that does not fit is cut), parents first."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}          # (parent, token) -> node
    for path in paths:
        at = ROOT
        for t in path:
            if (at, t) not in index:
                if len(tokens) >= max_nodes:
                    break
                index[(at, t)] = len(tokens)
                tokens.append(t)
                parents.append(at)
            at = index[(at, t)]
    return tokens, parents


def from_paths(found: list[tuple[list[int], list[int]]], device) -> TreeProposal:
    """Per row (tokens, parents) -> a point-mass TreeProposal (model-free drafters)."""
    import torch

    width = max((len(t) for t, _ in found), default=0)
    tokens = torch.tensor([t + [0] * (width - len(t)) for t, _ in found], dtype=torch.long).view(len(found), width)
    return TreeProposal(tokens.to(device), [p for _, p in found])


def fit(tree: TreeProposal, caps: list[int], stop: int | None) -> tuple[TreeProposal, list[list[int]] | None]:
    """Row b keeps its nodes of depth <= caps[b] and none after a `stop` token (EOS): a function of
    the drafts alone, so the acceptance rule stays exact. Returns (the tree, per row the kept nodes'
    indices in the tree given); (the tree itself, None) when nothing goes."""
    import torch

    keeps = []
    for b, par in enumerate(tree.parents):
        toks = tree.tokens[b, :len(par)].tolist()
        alive = prune_after(toks, par, stop) if stop is not None else list(range(len(par)))
        deep = depths(par)
        keeps.append([i for i in alive if deep[i] <= caps[b]])
    if all(len(k) == len(p) for k, p in zip(keeps, tree.parents, strict=True)):
        return tree, None
    width = max((len(k) for k in keeps), default=0)
    index = torch.tensor([k + [0] * (width - len(k)) for k in keeps], dtype=torch.long, device=tree.tokens.device)
    take = lambda t: None if t is None or width == 0 else t.gather(  # noqa: E731
        1, index.view(*index.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:]))
    tokens = take(tree.tokens) if width else tree.tokens[:, :0]
    return TreeProposal(tokens, [subtree(p, k) for p, k in zip(tree.parents, keeps, strict=True)],
                        take(tree.q), take(tree.hidden), take(tree.base_logits), tree.source), keeps


def chain_view(parents: list[int], path: list[int]) -> list[int]:
    """The nodes a chain would have drafted along the accepted path: the path, then the first child
    of its last node (the first candidate the rule rejected there), if it has any."""
    last = path[-1] if path else ROOT
    return path + children(parents)[last + 1][:1]
