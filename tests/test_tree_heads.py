"""Token trees drafted by an EAGLE head (`--drafter eagle --tree-nodes N`): greedy output equal to
`ar`'s for every draft-model method at 4, 8 and 16 nodes and B in {1, 2, 4}, the head's tree
forward computing what a chain down each path computes, one target pass per iteration and no
re-prefill of the head's cache.

The heads are the ones tests/test_eagle.py trains (its `heads` fixture, rebuilt for this module)."""

from __future__ import annotations

import pytest
import torch

from drift_cli.eagle.drafter import HeadDrafter
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.engine.policy import Rows
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import ROOT, TreeConfig, depths, path_to
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.vanilla import Vanilla
from tests.recording import unit_stream
from tests.test_eagle import EOS, METHODS, heads  # noqa: F401  (the fixture)
from tests.test_batch import GAMMA, MAX_NEW, PROMPTS

KINDS = ("eagle3", "eagle")


def _run(heads, kind: str, method: str, batch: int, nodes: int, **kw):  # noqa: F811
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=batch,
                       tree=TreeConfig(nodes=nodes, **kw))
    policy = Autoregressive() if method == "ar" else METHODS[method](heads[kind], heads[f"{kind}-offline"])
    target = CausalLM(heads["target"], "target")
    return run_stream(target, policy, unit_stream(PROMPTS, MAX_NEW), cfg), policy, target


@pytest.fixture(scope="module")
def reference(heads):  # noqa: F811
    run, _, _ = _run(heads, "eagle3", "ar", 1, 0)
    return [g.output_ids for g in run.generations]


def _matrix():
    """vanilla, drift and hybrid on both kinds at 8 nodes and B = 2, and the corners, in the default
    tier; the whole matrix (5 methods x 4, 8, 16 nodes x B 1, 2, 4 x 2 kinds) under `slow`."""
    for kind in KINDS:
        for method in ("vanilla", "drift", "offline", "osd", "hybrid"):
            for nodes in (4, 8, 16):
                for batch in (1, 2, 4):
                    fast = (method in ("vanilla", "drift", "hybrid") and (nodes, batch) == (8, 2)
                            or kind == "eagle3" and method == "vanilla" and (nodes, batch) in {(4, 1), (16, 4)})
                    yield pytest.param(kind, method, nodes, batch, marks=() if fast else pytest.mark.slow,
                                       id=f"{kind}-{method}-{nodes}-B{batch}")


@pytest.mark.parametrize("kind,method,nodes,batch", list(_matrix()))
def test_greedy_head_trees_equal_ar(heads, reference, kind, method, nodes, batch):  # noqa: F811
    run, policy, _ = _run(heads, kind, method, batch, nodes)
    assert run.complete and [g.output_ids for g in run.generations] == reference
    steps = run.steps
    assert sum(s.accepted for s in steps) > 0 and max(s.nodes for s in steps) <= nodes
    assert any(s.nodes > 1 + s.accepted for s in steps)          # real trees, not chains
    if method == "osd":
        assert policy.stats.updates > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["dynamic", "static"])
def test_head_trees_leave_the_first_child_at_several_depths_and_hold_eos(heads, reference, kind, shape):  # noqa: F811
    run, _, _ = _run(heads, kind, "vanilla", 2, 16, shape=shape)
    assert [g.output_ids for g in run.generations] == reference
    later = {d for s in run.steps for d, r in enumerate(s.ranks, 1) if r > 0}
    assert len(later) >= 2, later                                # a later sibling accepted at two depths or more
    assert any(g.hit_eos and g.steps[-1].emitted <= g.steps[-1].accepted for g in run.generations)


def test_a_head_tree_is_what_chains_down_its_paths_compute(heads):  # noqa: F811
    """Every node of a head's 16-node tree at B = 2 was drawn from the logits that a chain of the
    head, forced down that node's path after the same committed prefix, computes there: the
    tree mask, the node positions (committed + depth - 1) and each node's parent carry."""
    head, target = heads["eagle3"], heads["target"]
    lm = CausalLM(target, "t")
    lm.capture(head.target_layers)

    def states(ids: torch.Tensor) -> torch.Tensor:
        lm.reset()
        lm.forward(ids[None])
        return lm.features[0]

    policy = Vanilla(head)
    policy.tree = TreeConfig(nodes=16)
    policy.begin_batch(2)
    ids = [torch.tensor([3, 9, 4, 3, 9]), torch.tensor([5, 6, 7, 8, 5, 6, 2, 11, 5])]
    for s, p in enumerate(ids):
        policy.slot, policy.prompt_features = s, states(p)[:-1]
        policy.begin_prompt(p[None])
    tree = policy.propose_tree(Rows([0, 1], ids, [None, None]), GAMMA, Sampler())
    assert min(tree.num_nodes) > GAMMA and max(max(depths(p)) for p in tree.parents) == GAMMA
    for b, (c, parents) in enumerate(zip(ids, tree.parents, strict=True)):
        for i, p in enumerate(parents):
            chain = HeadDrafter(head)
            chain.add_features(0, states(c)[:-1])
            _, z = chain.forward_rows([0], [c[1:]])
            for node in ([] if p == ROOT else path_to(parents, p)):
                _, z = chain.forward_rows([0], [tree.tokens[b, node:node + 1]])    # reads the carry
            torch.testing.assert_close(tree.base_logits[b, i], z[0, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_head_trees_one_target_pass_per_iteration_and_no_reprefill(heads, reference, monkeypatch, batch):  # noqa: F811
    """The target: a prefill per admitted prompt and one pass per iteration. The head: each
    committed pair is fed once (real, with the target's state), never again after a rejection
    deep in a tree; the tree's nodes are fed through `forward_nodes` only."""
    fed: dict[int, list[tuple[int, int]]] = {}
    chain, nodes = HeadDrafter.forward_rows, HeadDrafter.forward_nodes

    def spy(self, slots, feeds):
        sizes = [len(f) for f in feeds] if isinstance(feeds, list) else [feeds.shape[1]] * len(slots)
        for s, n in zip(slots, sizes):
            assert self.rows.lengths[s] == self.real[s]             # the row's cache is its real prefix
            fed.setdefault(s, []).append((self.rows.lengths[s], n))
        out = chain(self, slots, feeds)
        assert all(self.rows.lengths[s] == self.real[s] for s in slots)   # and all it was fed is real
        return out

    expanded = []

    def spy_nodes(self, slots, feeds, states, attend):
        expanded.append(sum(len(f) for f in feeds))
        return nodes(self, slots, feeds, states, attend)

    monkeypatch.setattr(HeadDrafter, "forward_rows", spy)
    monkeypatch.setattr(HeadDrafter, "forward_nodes", spy_nodes)
    run, policy, target = _run(heads, "eagle3", "vanilla", batch, 8)
    assert [g.output_ids for g in run.generations] == reference
    iterations = len({s.step for s in run.steps})
    prefills = sum(len(p) > 1 for p in PROMPTS)
    assert target.forward_calls == iterations + prefills
    assert expanded and sum(expanded) > 0
    for slot, calls in fed.items():                            # positions fed, in order, each once per prompt
        for (start, n), (nxt, _) in zip(calls, calls[1:]):
            assert nxt in (0, start + n), (slot, calls)
    total = sum(n for calls in fed.values() for _, n in calls)
    assert total <= sum(len(p) + len(g.output_ids) - 2 for p, g in zip(PROMPTS, run.generations))
    assert any(s.accepted >= 1 and s.tried > 0 for s in run.steps)
