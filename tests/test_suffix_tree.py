"""The suffix structure against brute-force search, and the eviction bound of SuffixCache."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.scale import scaled

from drift_cli.suffix_tree import SuffixCache, SuffixTrie


def brute_count(docs, s, depth):
    if len(s) > depth:
        return 0
    n = len(s)
    if n == 0:                               # the empty string: one per suffix start (token)
        return sum(len(d) for d in docs)
    return sum(1 for d in docs for i in range(len(d) - n + 1) if d[i:i + n] == s)


def brute_continuations(docs, s, depth):
    if len(s) + 1 > depth:
        return {}
    n, out = len(s), {}
    for d in docs:
        for i in range(len(d) - n):
            if d[i:i + n] == s:
                out[d[i + n]] = out.get(d[i + n], 0) + 1
    return out


def brute_longest(docs, pattern, depth):
    return max((m for m in range(min(len(pattern), depth) + 1)
                if brute_count(docs, pattern[len(pattern) - m:], depth) > 0), default=0)


def substrings(docs, longest):
    return {tuple(d[i:j]) for d in docs for i in range(len(d)) for j in range(i, min(len(d), i + longest) + 1)}


def assert_matches_brute_force(trie: SuffixTrie, docs: list[list[int]], queries: list[list[int]]):
    depth = trie.max_depth
    assert trie.tokens == sum(len(d) for d in docs)
    assert trie.nodes == trie.materialised_nodes()
    for s in sorted(substrings(docs, depth + 1)) + [tuple(q) for q in queries]:
        s = list(s)
        assert trie.count(s) == brute_count(docs, s, depth), s
        assert trie.continuation_counts(s) == brute_continuations(docs, s, depth), s
    for q in queries:
        assert trie.longest_match(q) == brute_longest(docs, q, depth), q


tokens = st.lists(st.integers(0, 2), min_size=0, max_size=18)


@settings(max_examples=scaled(120), deadline=None)
@given(
    docs=st.lists(tokens, min_size=1, max_size=4),
    depth=st.integers(1, 6),
    interleave=st.randoms(use_true_random=False),
    queries=st.lists(st.lists(st.integers(0, 3), max_size=9), max_size=6),
)
def test_counts_match_brute_force_while_documents_grow_interleaved(docs, depth, interleave, queries):
    """Documents grow token by token, interleaved at random: every substring count, continuation
    count and longest match equals a brute-force search over the documents so far."""
    trie = SuffixTrie(depth)
    cursors = [0] * len(docs)
    while any(c < len(d) for c, d in zip(cursors, docs, strict=True)):
        i = interleave.choice([i for i, d in enumerate(docs) if cursors[i] < len(d)])
        trie.append(i, docs[i][cursors[i]])
        cursors[i] += 1
        if interleave.random() < 0.15:       # check some intermediate states too
            held = [d[:c] for d, c in zip(docs, cursors, strict=True)]
            assert_matches_brute_force(trie, held, queries)
    assert_matches_brute_force(trie, docs, queries)


@settings(max_examples=scaled(120), deadline=None)
@given(
    docs=st.lists(tokens, min_size=1, max_size=6),
    depth=st.integers(1, 6),
    order=st.randoms(use_true_random=False),
    queries=st.lists(st.lists(st.integers(0, 3), max_size=9), max_size=6),
)
def test_removal_leaves_exactly_the_remaining_documents(docs, depth, order, queries):
    trie = SuffixTrie(depth)
    for i, d in enumerate(docs):
        trie.extend(i, d)
        trie.close(i)
    alive = dict(enumerate(docs))
    for i in order.sample(list(alive), len(alive)):
        assert trie.remove(i) == len(alive.pop(i))
        assert_matches_brute_force(trie, list(alive.values()), queries)
    # the emptied trie keeps growing correctly
    trie.extend("late", [0, 1, 0, 1, 2, 0, 1])
    assert_matches_brute_force(trie, [[0, 1, 0, 1, 2, 0, 1]], queries)
    assert trie.remove("late") == 7
    assert trie.nodes == 0 and trie.tokens == 0 and trie.root.children == {}


def test_periodic_document_is_counted_exactly():
    """The self-overlapping case: suffixes of one document split each other's lazy leaves."""
    for depth in (1, 2, 3, 5, 8):
        doc = [0] * 20 + [1, 0] * 10
        trie = SuffixTrie(depth)
        for k, t in enumerate(doc):
            trie.append("d", t)
            if k % 3 == 0:
                assert_matches_brute_force(trie, [doc[:k + 1]], [])
        assert_matches_brute_force(trie, [doc], [[1, 0, 1], [0, 0, 0, 0]])


def _brute_draft_steps(docs, pattern, draft, depth, max_spec_factor, min_token_prob):
    """Checks one draft: every token is a most frequent continuation, probabilities are the
    products of count ratios, the length respects the limits."""
    m = draft.match_len
    s = list(pattern[len(pattern) - m:])
    assert brute_count(docs, s, depth) > 0
    assert len(draft.tokens) <= int(m * max_spec_factor + 1e-6)
    prob = 1.0
    for t, p in zip(draft.tokens, draft.probs, strict=True):
        cont = brute_continuations(docs, s, depth)
        assert cont[t] == max(cont.values())
        prob *= cont[t] / brute_count(docs, s, depth)
        assert abs(p - prob) < 1e-9 and p >= min_token_prob
        s.append(t)
    assert abs(draft.score - sum(draft.probs)) < 1e-9


@settings(max_examples=scaled(80), deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=25), min_size=1, max_size=3),
    depth=st.integers(2, 8),
    pattern=st.lists(st.integers(0, 2), min_size=1, max_size=10),
    max_tokens=st.integers(1, 6),
    factor=st.sampled_from([0.5, 1.0, 2.0]),
    min_prob=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_speculate_follows_the_counts(docs, depth, pattern, max_tokens, factor, min_prob):
    trie = SuffixTrie(depth)
    for i, d in enumerate(docs):
        trie.extend(i, d)
    draft = trie.speculate(pattern, max_tokens, factor, min_prob)
    assert len(draft.tokens) <= max_tokens
    if draft.tokens:
        _brute_draft_steps(docs, pattern, draft, depth, factor, min_prob)
    else:
        # nothing drafted only when no match length offers a probable enough continuation
        for m in range(1, min(len(pattern), depth) + 1):
            s = list(pattern[len(pattern) - m:])
            cont = brute_continuations(docs, s, depth)
            if cont and int(m * factor + 1e-6) >= 1:
                assert max(cont.values()) / brute_count(docs, s, depth) < min_prob


def reference_speculate(trie, pattern, max_tokens, factor, min_prob):
    """Try every match length; the highest score wins, the longer match on ties."""
    best = None
    for m in range(1, min(len(pattern), trie.max_depth) + 1):
        pos = trie._find(pattern[len(pattern) - m:])
        if pos is None:
            break
        d = trie._walk(pos, min(max_tokens, int(m * factor + 1e-6)), min_prob)
        if d.tokens and (best is None or d.score >= best[1].score):
            best = (m, d)
    return (0, []) if best is None else (best[0], best[1].tokens)


@settings(max_examples=scaled(150), deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=3),
    depth=st.integers(1, 10),
    pattern=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    max_tokens=st.integers(1, 8),
    factor=st.sampled_from([0.3, 1.0, 2.5]),
    min_prob=st.sampled_from([0.0, 0.1, 0.4]),
)
def test_speculate_early_exit_equals_trying_every_match_length(docs, depth, pattern, max_tokens, factor, min_prob):
    trie = SuffixTrie(depth)
    for i, d in enumerate(docs):
        trie.extend(i, d)
    draft = trie.speculate(pattern, max_tokens, factor, min_prob)
    assert (draft.match_len, draft.tokens) == reference_speculate(trie, pattern, max_tokens, factor, min_prob)


def test_speculate_prefers_the_longer_match_and_grows_with_it():
    trie = SuffixTrie(16)
    trie.extend(0, [5, 1, 2, 3, 4, 6, 7, 8, 9])
    trie.extend(1, [1, 2, 9])
    # "1 2" is followed by 3 once and by 9 once; "5 1 2" only by 3 4 6 ...
    d = trie.speculate([5, 1, 2], max_tokens=8, max_spec_factor=1.0, min_token_prob=0.1)
    assert d.match_len == 3 and d.tokens == [3, 4, 6]
    d = trie.speculate([5, 1, 2], max_tokens=8, max_spec_factor=2.0, min_token_prob=0.1)
    assert d.tokens == [3, 4, 6, 7, 8, 9]
    d = trie.speculate([5, 1, 2], max_tokens=2, max_spec_factor=2.0, min_token_prob=0.1)
    assert d.tokens == [3, 4]


def test_cache_eviction_bounds_memory_and_keeps_the_newest_documents():
    rng = random.Random(0)
    depth, budget = 6, 60
    cache = SuffixCache(depth, budget)
    added: list[tuple[str, list[int]]] = []
    for k in range(80):
        tenant = rng.choice(["a", "b", "c"])
        doc = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        cache.add(tenant, doc)
        if doc:
            added.append((tenant, doc))
        assert cache.tokens <= budget
        assert cache.tokens == sum(t.tokens for t in cache.trees.values())
        assert cache.nodes <= cache.tokens * depth
        # what is held is exactly the newest documents that fit, oldest evicted first
        held, total = [], 0
        for tenant_d, d in reversed(added):
            if total + len(d) > budget:
                break
            held.append((tenant_d, d))
            total += len(d)
        assert cache.documents == len(held) and cache.tokens == total
        for tenant_t, tree in cache.trees.items():
            assert sorted(tree.docs.values()) == sorted(d for t, d in held if t == tenant_t)
    assert cache.evictions == len(added) - cache.documents > 0
    for tenant_t, tree in cache.trees.items():
        docs = list(tree.docs.values())
        assert_matches_brute_force(tree, docs, [[0, 1], [3, 3, 3]])


def test_cache_truncates_a_document_longer_than_the_budget():
    cache = SuffixCache(4, 10)
    cache.add("a", [1, 2, 3])
    cache.add("a", list(range(25)))
    assert cache.tokens == 10 and cache.documents == 1 and cache.evictions == 1
    assert list(cache.tree("a").docs.values()) == [list(range(15, 25))]
