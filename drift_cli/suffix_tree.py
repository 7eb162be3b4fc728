"""The suffix structure behind the `suffix` method (SuffixDecoding-style drafting, no draft model).

`SuffixTrie` holds every suffix of its documents up to `max_depth` tokens, with counts:
the node of a string s (|s| <= max_depth) counts the positions where s occurs in the documents,
so the children of s count its continuations (s + t). Documents grow token by token (`append`,
O(max_depth) per token) and can be removed (`remove`), which is how `SuffixCache` evicts the
oldest documents to bound memory.

Memory: a node whose string occurs exactly once is a *lazy* leaf. It stores where its single
occurrence continues (`tail = (document, index)`) instead of a chain of count-1 nodes, so unique
text costs about one node per token instead of max_depth. A second occurrence that walks into a
lazy leaf materialises it one level at a time ("split").

`speculate` follows SuffixDecoding (ArcticInference): for every match length m of the pattern's
suffix, walk the most frequent child from the matched node for at most min(max_tokens,
floor(m * max_spec_factor)) tokens while the path probability (product of child/parent counts)
stays >= min_token_prob; the candidate with the highest score (sum of path probabilities: the
expected number of accepted tokens under the counts) wins, the longer match on ties.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence


class _Node:
    __slots__ = ("count", "children", "tail")

    def __init__(self, count: int = 0, tail: tuple[list[int], int] | None = None) -> None:
        self.count = count                        # occurrences of this node's string
        self.children: dict[int, _Node] = {}      # token -> node of string + token (non-lazy only)
        self.tail = tail                          # lazy leaf: (document tokens, index of the next token)


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)   # path probability of each drafted token
    score: float = 0.0                                  # sum(probs): expected accepted tokens
    match_len: int = 0


@dataclass
class TreeDraft:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)    # per node: its parent's index, -1 for the root's children
    score: float = 0.0                                  # sum of the nodes' path probabilities
    match_len: int = 0


class SuffixTrie:
    """Depth-bounded suffix trie with occurrence counts over a set of token documents."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()                       # root.count = tokens held
        self.docs: dict[Hashable, list[int]] = {}
        # Per growing document: the suffixes that can still grow, oldest (longest) first, as
        # [start, node, node_depth]: node is the deepest materialised node on the suffix's path.
        self._active: dict[Hashable, deque[list]] = {}
        self.nodes = 0                            # materialised nodes, root excluded

    @property
    def tokens(self) -> int:
        return self.root.count

    # -- building --------------------------------------------------------------------------

    def extend(self, doc: Hashable, tokens: Sequence[int]) -> None:
        self.docs.setdefault(doc, [])             # an empty document exists too
        for t in tokens:
            self.append(doc, t)

    def close(self, doc: Hashable) -> None:
        """The document will not grow any more: drop its growth bookkeeping."""
        self._active.pop(doc, None)

    def append(self, doc: Hashable, token: int) -> None:
        """Append one token to a (new or growing) document: every suffix that ends at the new
        token, up to max_depth long, gains one occurrence."""
        seq = self.docs.setdefault(doc, [])
        active = self._active.setdefault(doc, deque())
        j = len(seq)                              # index of the new token
        seq.append(token)                         # before the walk: lazy tails of this document see it
        self.root.count += 1
        active.append([j, self.root, 0])
        if j - active[0][0] + 1 > self.max_depth:
            active.popleft()                      # that suffix is max_depth long already
        # Oldest first: a suffix that splits a lazy leaf of this same document is always younger
        # than the leaf's owner, so the owner has been extended (implicitly, via its tail) already.
        for entry in active:
            start, node, depth = entry
            length = j - start                    # suffix length before this token
            while node.tail is None and depth < length:   # catch up with splits made by others
                node = node.children[seq[start + depth]]
                depth += 1
            if node.tail is None:                 # the suffix ends at a materialised node: extend it
                node = self._enter(node, depth, token, (seq, j + 1))
                depth += 1
            entry[1], entry[2] = node, depth      # (a lazy node extends through its tail by itself)

    def _enter(self, node: _Node, depth: int, token: int, tail: tuple[list[int], int]) -> _Node:
        """One more occurrence of (node's string + token); node is non-lazy at `depth`."""
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = _Node(1, tail)
            self.nodes += 1
            return child
        if child.tail is not None:                # a lazy leaf meets its second occurrence: split
            seq, p = child.tail
            child.tail = None
            if p < len(seq) and depth + 1 < self.max_depth:
                child.children[seq[p]] = _Node(1, (seq, p + 1))
                self.nodes += 1
        child.count += 1
        return child

    def remove(self, doc: Hashable) -> int:
        """Remove a document (every suffix occurrence it holds). Returns its token count."""
        seq = self.docs.pop(doc)
        self._active.pop(doc, None)
        for start in range(len(seq)):
            self.root.count -= 1
            node, depth, end = self.root, 0, min(self.max_depth, len(seq) - start)
            while depth < end and node.tail is None:
                token = seq[start + depth]
                child = node.children[token]
                child.count -= 1
                if child.count == 0:              # only this occurrence was left: drop the node
                    del node.children[token]      # (deeper nodes of this path go with it)
                    self.nodes -= 1
                node, depth = child, depth + 1
        return len(seq)

    # -- queries ---------------------------------------------------------------------------

    def _step(self, pos: tuple[_Node, int, int], token: int) -> tuple[_Node, int, int] | None:
        """pos = (node, tokens read into its lazy tail, depth) -> the position after token."""
        node, extra, depth = pos
        if depth >= self.max_depth:
            return None
        if node.tail is not None:
            seq, p = node.tail
            q = p + extra
            return (node, extra + 1, depth + 1) if q < len(seq) and seq[q] == token else None
        child = node.children.get(token)
        return (child, 0, depth + 1) if child is not None else None

    def _find(self, tokens: Sequence[int]) -> tuple[_Node, int, int] | None:
        pos: tuple[_Node, int, int] | None = (self.root, 0, 0)
        for t in tokens:
            pos = self._step(pos, t)
            if pos is None:
                return None
        return pos

    def _next(self, pos: tuple[_Node, int, int]) -> list[tuple[int, _Node | None, int]]:
        """Continuations of a position: [(token, child node or None inside a lazy tail, count)]."""
        node, extra, depth = pos
        if depth >= self.max_depth:
            return []
        if node.tail is not None:
            seq, p = node.tail
            return [(seq[p + extra], None, 1)] if p + extra < len(seq) else []
        return [(t, c, c.count) for t, c in node.children.items()]

    def count(self, tokens: Sequence[int]) -> int:
        """Occurrences of `tokens` in the documents (0 when longer than max_depth)."""
        pos = self._find(tokens)
        return 0 if pos is None else pos[0].count

    def continuation_counts(self, tokens: Sequence[int]) -> dict[int, int]:
        """{t: occurrences of tokens + [t]} for every t that follows `tokens` somewhere."""
        pos = self._find(tokens)
        return {} if pos is None else {t: c for t, _, c in self._next(pos)}

    def longest_match(self, pattern: Sequence[int]) -> int:
        """Length of the longest suffix of pattern (at most max_depth) that occurs."""
        lo, hi = 0, min(len(pattern), self.max_depth)   # occurs(lo); binary search, as occurrence
        while lo < hi:                                  # is monotone in the suffix length
            mid = (lo + hi + 1) // 2
            if self._find(pattern[len(pattern) - mid:]) is not None:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _walk(self, pos: tuple[_Node, int, int], limit: int, min_token_prob: float) -> Draft:
        """Follow the most frequent continuation (first seen on ties) while probable enough."""
        draft, prob = Draft(), 1.0
        while len(draft.tokens) < limit:
            options = self._next(pos)
            if not options:
                break
            token, child, count = max(options, key=lambda o: o[2])
            prob *= count / pos[0].count
            if prob < min_token_prob:
                break
            node, extra, depth = pos
            pos = (node, extra + 1, depth + 1) if child is None else (child, 0, depth + 1)
            draft.tokens.append(token)
            draft.probs.append(prob)
            draft.score += prob
        return draft

    def speculate(self, pattern: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1) -> Draft:
        """The best draft over every match length of pattern's suffixes (see the module doc).

        Longest match first: a draft's score is at most its length limit, which shrinks with the
        match length, so the search stops once no shorter match can score higher (ties go to the
        longer match). Same result as trying every length, usually after one walk.
        """
        best = Draft()
        for m in range(self.longest_match(pattern), 0, -1):
            limit = min(max_tokens, int(m * max_spec_factor + 1e-6))
            if limit <= best.score:
                break
            draft = self._walk(self._find(pattern[len(pattern) - m:]), limit, min_token_prob)
            if draft.tokens and draft.score > best.score:
                draft.match_len = m
                best = draft
        return best

    def speculate_tree(self, pattern: Sequence[int], max_depth: int, max_nodes: int, max_spec_factor: float = 1.0,
                       min_token_prob: float = 0.1) -> TreeDraft:
        """SuffixDecoding's speculation tree: at the match length `speculate` picks, grow the tree
        from the matched node best-first by path probability (a child's is its parent's times
        count / parent count), at most max_nodes nodes, depth <= min(max_depth, floor(m x
        max_spec_factor)), path probability >= min_token_prob. Nodes come parents first,
        siblings by descending count."""
        chain = self.speculate(pattern, max_depth, max_spec_factor, min_token_prob)
        tree = TreeDraft()
        if not chain.tokens:
            return tree
        m = chain.match_len
        limit = min(max_depth, int(m * max_spec_factor + 1e-6))
        heap: list[tuple[float, int, int, int, tuple]] = []        # (-prob, order, parent, depth, pos)
        order = 0

        def push(pos, parent: int, depth: int, prob: float) -> None:
            nonlocal order
            if depth >= limit:
                return
            for token, child, count in sorted(self._next(pos), key=lambda o: -o[2]):
                p = prob * count / pos[0].count
                if p >= min_token_prob:
                    node, extra, d = pos
                    nxt = (node, extra + 1, d + 1) if child is None else (child, 0, d + 1)
                    heapq.heappush(heap, (-p, order, parent, depth + 1, (token, nxt)))
                    order += 1
        push(self._find(pattern[len(pattern) - m:]), -1, 0, 1.0)
        found: list[tuple[int, int, int, int, float]] = []           # (depth, order, parent, token, prob)
        while heap and len(found) < max_nodes:
            neg, o, parent, depth, (token, pos) = heapq.heappop(heap)
            found.append((depth, o, parent, token, -neg))
            push(pos, len(found) - 1, depth, -neg)
        ranked = sorted(range(len(found)), key=lambda i: (found[i][0], found[i][1]))
        new = {old: i for i, old in enumerate(ranked)}
        for old in ranked:
            _, _, parent, token, prob = found[old]
            tree.tokens.append(token)
            tree.parents.append(-1 if parent == -1 else new[parent])
            tree.score += prob
        tree.match_len = m
        return tree

    def materialised_nodes(self) -> int:
        """Walk the trie and count its nodes (a check of `nodes`; O(nodes))."""
        stack, n = [self.root], 0
        while stack:
            node = stack.pop()
            n += len(node.children)
            stack.extend(node.children.values())
        return n


class SuffixCache:
    """Per-tenant tries over finished documents (the target's outputs), with a global token
    budget: the oldest documents (of any tenant) are evicted first."""

    def __init__(self, max_depth: int, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_depth, self.max_tokens = max_depth, max_tokens
        self.trees: dict[str, SuffixTrie] = {}
        self._order: deque[tuple[str, int]] = deque()   # (tenant, document id), oldest first
        self._next_id = 0
        self.tokens = 0
        self.evictions = 0
        self.peak_nodes = 0

    def tree(self, tenant: str) -> SuffixTrie | None:
        return self.trees.get(tenant)

    def add(self, tenant: str, tokens: Sequence[int]) -> None:
        """Insert a finished document; a document longer than the budget keeps its last tokens."""
        tokens = list(tokens)[-self.max_tokens:]
        if not tokens:
            return
        while self.tokens + len(tokens) > self.max_tokens:
            self._evict_oldest()
        tree = self.trees.setdefault(tenant, SuffixTrie(self.max_depth))
        doc = self._next_id
        self._next_id += 1
        tree.extend(doc, tokens)
        tree.close(doc)
        self._order.append((tenant, doc))
        self.tokens += len(tokens)
        self.peak_nodes = max(self.peak_nodes, self.nodes)

    def _evict_oldest(self) -> None:
        tenant, doc = self._order.popleft()
        tree = self.trees[tenant]
        self.tokens -= tree.remove(doc)
        self.evictions += 1
        if not tree.docs:
            del self.trees[tenant]

    @property
    def nodes(self) -> int:
        return sum(t.nodes for t in self.trees.values())

    @property
    def documents(self) -> int:
        return len(self._order)
