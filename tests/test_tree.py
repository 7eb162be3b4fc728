"""Token trees (`--tree-nodes`): the tree data, the tree acceptance rule, greedy losslessness of
every drafting method at trees of 4, 8 and 16 nodes and B in {1, 2, 4}, one target pass per
iteration, and the sampling chi-square with its two negative controls."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from drift_cli.drift.config import DriftConfig
from drift_cli.engine import loop
from drift_cli.engine.acceptance import accept_greedy, accept_sampling, accept_tree_greedy, accept_tree_sampling
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.engine.tree import ROOT, TreeConfig, TreeProposal, chain_parents, chain_view, children, depths, fit, \
    sibling_ranks, verify_attention
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.hybrid import Hybrid
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.config import OSDConfig
from tests.models import tiny_llama
from tests.recording import unit_stream

SCALE = 4.0
EOS = 24
MAX_NEW = 20
GAMMA = 4
PROMPTS = [[3, 9, 4, 3, 9, 4, 3, 9], [1], [5, 6, 7, 8, 5, 6, 2, 11, 5, 6, 7, 8], [3, 9, 4], [12, 13],
           [20, 21, 22, 20, 21], [1, 2, 3, 4, 5, 6, 1, 2, 3], [30], [3, 9, 4, 3, 9], [40, 41, 42, 43, 40, 41, 42]]
DRIFT_CFG = DriftConfig(gain=2.0, tau=0.3, sigma=1.0, bank_size=64, support=8)

METHODS = {
    "vanilla": lambda d, o: Vanilla(d),
    "drift": lambda d, o: DriftMethod(d, DRIFT_CFG),
    "offline": lambda d, o: Offline(o),
    "osd": lambda d, o: OnlineDistillation(d, OSDConfig(interval=2.0, steps=1, batch=4)),
    "pld": lambda d, o: PromptLookup(),
    "suffix": lambda d, o: SuffixDecoding(),
    "hybrid": lambda d, o: Hybrid(SuffixDecoding(), Vanilla(d)),
    "hybrid-pld-drift": lambda d, o: Hybrid(PromptLookup(), DriftMethod(d, DRIFT_CFG)),
}


def near_draft(target: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """The target with a perturbed output head: its top choice is often the target's second or
    third, so accepted paths leave the first child."""
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=g) * noise)
    return draft


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(48, 48, 2, 3, SCALE)
    return near_draft(target, 0.1, 0), near_draft(target, 0.05, 1), target


def _run(models, method: str, batch: int, nodes: int, **kw):
    draft, other, target = models
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=batch,
                       tree=TreeConfig(nodes=nodes, **kw))
    lm = CausalLM(target, "target")
    return run_stream(lm, METHODS[method](draft, other) if method != "ar" else Autoregressive(),
                      unit_stream(PROMPTS, MAX_NEW), cfg), lm


@pytest.fixture(scope="module")
def reference(models):
    run, _ = _run(models, "ar", 1, 0)
    outputs = [g.output_ids for g in run.generations]
    assert any(g.hit_eos for g in run.generations)
    return outputs


# -- the data ---------------------------------------------------------------------------------------


def test_tree_data_is_derived_from_parents():
    #        root
    #       /    \
    #      0      1
    #     / \      \
    #    2   3      4
    #    |
    #    5
    parents = [ROOT, ROOT, 0, 0, 1, 2]
    assert depths(parents) == [1, 1, 2, 2, 2, 3]
    assert children(parents) == [[0, 1], [2, 3], [4], [5], [], [], []]
    assert sibling_ranks(parents) == [0, 1, 0, 1, 0, 0]
    assert chain_parents(4) == [ROOT, 0, 1, 2]
    assert chain_view(parents, [0, 2]) == [0, 2, 5] and chain_view(parents, [1, 4]) == [1, 4]
    assert chain_view(parents, []) == [0]


def test_verify_attention_sees_the_prefix_and_the_ancestors():
    # a row with 5 cached slots, 2 fed committed tokens, then the tree above
    att = verify_attention([5], [2], [[ROOT, ROOT, 0, 0, 1, 2]], 8, "cpu")
    vis = att.visible[0]
    assert att.positions[0].tolist() == [5, 6, 7, 7, 8, 8, 8, 9]       # root at 6, node depth d at 6 + d
    assert vis[0, :6].tolist() == [True] * 6 and not vis[0, 6:].any()    # the prefix is causal
    seen = lambda q: [k for k in range(5, 13) if vis[q, k]]  # noqa: E731
    assert seen(2) == [5, 6, 7]                    # node 0: the prefix and itself
    assert seen(3) == [5, 6, 8]                    # node 1 does not see its sibling
    assert seen(7) == [5, 6, 7, 9, 12]             # node 5: prefix, 0, 2, itself
    assert vis[:, :5].all()                        # the cache's committed slots: everyone


def test_fit_cuts_depth_and_what_follows_eos():
    tree = TreeProposal(torch.tensor([[10, 24, 12, 13, 14, 15]]), [[ROOT, ROOT, 0, 1, 1, 2]])
    cut, kept = fit(tree, [2], stop=24)
    assert kept == [[0, 1, 2]] and cut.parents == [[ROOT, ROOT, 0]] and cut.tokens.tolist() == [[10, 24, 12]]
    same, none = fit(tree, [3], stop=None)
    assert same is tree and none is None


# -- the rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_tree_rule_on_a_chain_is_the_chain_rule(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 3, 4, 6
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    tokens = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    parents = [chain_parents(k)] * b
    acc, nxt = accept_sampling(tokens, q, p, torch.Generator().manual_seed(seed))
    paths, tnxt = accept_tree_sampling(tokens, parents, q, p, torch.Generator().manual_seed(seed))
    assert [len(x) for x in paths] == acc.tolist() and torch.equal(nxt, tnxt)
    logits = torch.randn(b, k + 1, v, generator=g)
    tokens[0] = logits[0, :k].argmax(-1)           # row 0 accepts everything
    acc, nxt = accept_greedy(tokens, logits)
    paths, tnxt = accept_tree_greedy(tokens, parents, logits)
    assert [len(x) for x in paths] == acc.tolist() and torch.equal(nxt, tnxt)


def test_greedy_follows_the_argmax_into_a_later_sibling():
    # root's children 7 (rank 0), 4 (rank 1); node 1's children 2, 5; the target wants 4, 5, then 6
    tokens = torch.tensor([[7, 4, 2, 5]])
    parents = [[ROOT, ROOT, 1, 1]]
    logits = torch.full((1, 5, 8), -5.0)
    for at, want in [(0, 4), (2, 5), (4, 6)]:       # at the root, at node 1, at node 3
        logits[0, at, want] = 5.0
    paths, nxt = accept_tree_greedy(tokens, parents, logits)
    assert paths == [[1, 3]] and nxt.tolist() == [6]


def test_sampling_tries_siblings_against_the_residual():
    """p puts all its mass on token 2; point-mass siblings 0, 1, 2: the first two are rejected for
    sure and the third accepted for sure, whatever the random numbers."""
    p = torch.zeros(1, 4, 3)
    p[0, 0, 2] = 1.0
    p[0, 1:] = 1.0 / 3
    for seed in range(5):
        paths, _ = accept_tree_sampling(torch.tensor([[0, 1, 2]]), [[ROOT, ROOT, ROOT]], None, p,
                                        torch.Generator().manual_seed(seed))
        assert paths == [[2]]


# -- greedy: every method reproduces ar ------------------------------------------------------------


def _matrix():
    """Every method at 8 nodes and B = 2 in the default tier; the whole matrix (4, 8, 16 nodes x
    B 1, 2, 4) under `slow`."""
    for method in METHODS:
        for nodes in (4, 8, 16):
            for batch in (1, 2, 4):
                fast = nodes == 8 and batch == 2 or (method == "vanilla" and (nodes, batch) in {(4, 1), (16, 4)})
                yield pytest.param(method, nodes, batch, marks=() if fast else pytest.mark.slow,
                                   id=f"{method}-{nodes}-B{batch}")


@pytest.mark.parametrize("method,nodes,batch", list(_matrix()))
def test_greedy_trees_equal_ar(models, reference, method, nodes, batch):
    run, _ = _run(models, method, batch, nodes)
    assert run.complete and [g.output_ids for g in run.generations] == reference
    steps = run.steps
    assert sum(s.accepted for s in steps) > 0
    assert max(s.nodes for s in steps) <= nodes


@pytest.mark.parametrize("shape", ["dynamic", "static"])
def test_model_trees_leave_the_first_child_at_several_depths_and_hold_eos(models, reference, shape):
    run, _ = _run(models, "vanilla", 2, 8, shape=shape)
    assert [g.output_ids for g in run.generations] == reference
    steps = run.steps
    later = {d for s in steps for d, r in enumerate(s.ranks, 1) if r > 0}
    assert len(later) >= 2, later                           # a later sibling accepted at two depths or more
    assert max(s.nodes for s in steps) == 8 and any(s.nodes > s.drafted for s in steps)
    # a row's last iteration accepted a drafted EOS inside its tree
    assert any(g.hit_eos and g.steps[-1].emitted <= g.steps[-1].accepted for g in run.generations)


@pytest.mark.parametrize("method", ["hybrid", "hybrid-pld-drift"])
def test_hybrid_trees_leave_the_first_child_at_several_depths_and_hold_eos(models, reference, method):
    run, _ = _run(models, method, 2, 16)
    assert [g.output_ids for g in run.generations] == reference
    model = [s for s in run.steps if s.source in ("vanilla", "drift")]
    copied = [s for s in run.steps if s.source in ("suffix", "pld")]
    assert model and copied and max(s.nodes for s in model) == 16
    later = {d for s in model for d, r in enumerate(s.ranks, 1) if r > 0}
    assert len(later) >= 2, later
    assert any(g.hit_eos and g.steps[-1].emitted <= g.steps[-1].accepted for g in run.generations)


@pytest.mark.parametrize("copy", ["suffix", "pld"])
def test_hybrid_proposes_the_chosen_sources_own_tree(models, copy):
    """Row 0's context repeats with two continuations (it copies: a branching copying tree), row 1's
    never repeats (the model source's tree): each row's tree is the one its source proposes alone."""
    from drift_cli.engine.policy import Rows
    from drift_cli.engine.sampling import Sampler
    from drift_cli.methods.settings import HybridConfig

    draft = models[0]
    prompts = {"suffix": [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7, 3, 5, 6],
               "pld": [1, 2, 3, 7, 0, 5, 2, 3, 9, 0, 1, 2, 3]}[copy], [40, 41, 42, 43, 44, 45]
    cfg = TreeConfig(nodes=8)

    def started(policy):
        policy.tree = cfg
        policy.begin_batch(2)
        for s, p in enumerate(prompts):
            policy.slot = s
            policy.begin_prompt(torch.tensor([p]))
        return policy
    make_copy = SuffixDecoding if copy == "suffix" else PromptLookup
    hybrid = started(Hybrid(make_copy(), Vanilla(draft), HybridConfig(rule="length", min_length=1)))
    rows = Rows([0, 1], [torch.tensor(p) for p in prompts], [None, None])
    tree = hybrid.propose_tree(rows, GAMMA, Sampler())
    assert tree.source == [copy, "vanilla"]
    alone = [started(make_copy()).propose_tree(rows, GAMMA, Sampler()),
             started(Vanilla(draft)).propose_tree(rows, GAMMA, Sampler())]
    for b, want in enumerate(alone):
        n = len(want.parents[b])
        assert tree.parents[b] == want.parents[b] and tree.tokens[b, :n].tolist() == want.tokens[b, :n].tolist()
    assert len(children(tree.parents[0])[0]) >= 2 and len(tree.parents[1]) == 8     # both are real trees


def test_trees_accept_more_than_chains(models):
    chain, _ = _run(models, "vanilla", 1, 0)
    tree, _ = _run(models, "vanilla", 1, 16)
    tau = lambda r: sum(s.emitted for s in r.steps) / len(r.steps)  # noqa: E731
    assert tau(tree) > tau(chain)


# -- one target pass per iteration, no re-prefill ------------------------------------------------


def test_one_target_pass_per_iteration_and_no_reprefill(models, reference, monkeypatch):
    fed: list[list[int]] = []
    real = CausalLM.forward_rows

    def spy(self, slots, feeds, attend=None):
        if self.name == "target":
            fed.append([len(f) for f in feeds] if attend is not None else [])
        return real(self, slots, feeds, attend)
    monkeypatch.setattr(CausalLM, "forward_rows", spy)
    run, lm = _run(models, "vanilla", 2, 8)
    assert [g.output_ids for g in run.generations] == reference
    iterations = len({s.step for s in run.steps})
    admissions = sum(len(p) > 1 for p in PROMPTS)
    assert lm.forward_calls == iterations + admissions        # one pass per iteration, one per prefill
    verifications = [f for f in fed if f]
    assert len(verifications) == iterations
    # each verification feeds the row's one uncached committed token and its tree: never more,
    # even after a rejection deep in the tree (no re-prefill)
    nodes = [s.nodes for s in sorted(run.steps, key=lambda s: (s.step, s.slot))]
    assert sorted(n for f in verifications for n in f) == sorted(1 + n for n in nodes)
    assert any(s.accepted >= 1 and s.tried > 0 for s in run.steps)   # rejections below the root
    assert any(s.accepted >= 2 for s in run.steps)


def test_tree_metrics(models):
    from drift_cli import metrics

    run, _ = _run(models, "vanilla", 1, 8)
    by_depth = metrics.acceptance_by_depth(run.steps, GAMMA)
    by_rank = metrics.acceptance_by_sibling_rank(run.steps)
    assert by_depth is not None and len(by_depth) == GAMMA and all(x is None or 0 <= x <= 1 for x in by_depth)
    assert by_rank is not None and by_rank[0] is not None and by_rank[1] is not None and by_rank[1] > 0
    assert 0 < metrics.nodes_per_step(run.steps) <= 8
    chain, _ = _run(models, "vanilla", 1, 0)
    assert metrics.acceptance_by_depth(chain.steps, GAMMA) is None
    assert metrics.acceptance_by_sibling_rank(chain.steps) is None


def test_drift_learns_from_the_path_or_every_scored_state(models, reference):
    updates = {}
    for learn in ("path", "all"):
        run, _ = _run(models, "drift", 2, 8, learn=learn)
        assert [g.output_ids for g in run.generations] == reference
        updates[learn] = run.report["updates"] + run.report["allocations"]
    assert updates["all"] > updates["path"] > 0


# -- sampling: the chi-square and its negative controls ---------------------------------------------

VOCAB = 8
PROMPT = [1, 5, 2]
TREE8 = TreeConfig(nodes=8, branch=3)


class WrongTreeRule(Vanilla):
    """Draws the tree from a biased q' but hands the engine the unbiased q."""

    name = "wrong-tree"

    def adjust(self, hidden, logits, sampler):
        return logits + torch.tensor([3.0, 0, 0, 0, 0, 0, 0, -2.0])

    def propose_tree(self, context, gamma, sampler):
        tree = super().propose_tree(context, gamma, sampler)
        tree.q = sampler.probs(sampler.sampling_logits(tree.base_logits))
        return tree


def _moving_drift(draft):
    return DriftMethod(draft, DriftConfig(gain=3.0, tau=0.0, sigma=1.0, bank_size=16, support=4))


@pytest.fixture(scope="module")
def pair():
    from tests.models import tiny_pair

    return tiny_pair(vocab=VOCAB, seed=11)


def _p_value(pair, make, **kw):
    from tests.exactness import sampling_p_value

    draft, target = pair
    return sampling_p_value(target, lambda: make(draft), PROMPT, samples=3000, batch=2, tree=TREE8, **kw)


@pytest.mark.stats
def test_tree_sampling_with_drift_matches_the_target(pair):
    p = _p_value(pair, _moving_drift)
    assert p > 1e-3, f"output distribution with trees differs from the target's (p = {p:.2e})"


@pytest.mark.stats
def test_wrong_rule_is_detected_on_trees(pair):
    p = _p_value(pair, WrongTreeRule)
    assert p < 1e-3, f"the wrong acceptance rule went unnoticed (p = {p:.3f})"


@pytest.mark.stats
def test_siblings_against_p_instead_of_the_residual_is_detected(pair, monkeypatch):
    monkeypatch.setattr(loop, "accept_tree_sampling", functools.partial(accept_tree_sampling, against_p=True))
    p = _p_value(pair, _moving_drift)
    assert p < 1e-3, f"siblings tried against p went unnoticed (p = {p:.3f})"


class _CountingTrees(Hybrid):
    def propose_tree(self, context, gamma, sampler):
        tree = super().propose_tree(context, gamma, sampler)
        for s in tree.source:
            self.chosen[s] = self.chosen.get(s, 0) + 1
        return tree


@pytest.mark.stats
def test_hybrid_tree_sampling_matches_the_target(pair):
    """Suffix trees (point masses) and a moving DRIFT's trees merged in one verification."""
    from drift_cli.methods.settings import HybridConfig, SuffixConfig

    made = []

    def make(draft):
        h = _CountingTrees(SuffixDecoding(SuffixConfig(min_token_prob=0.0)), _moving_drift(draft),
                           HybridConfig(min_score=0.5))
        h.chosen = {}
        made.append(h)
        return h
    p = _p_value(pair, make)
    chosen = made[0].chosen
    assert chosen.get("suffix", 0) > 0.1 * sum(chosen.values()) and chosen.get("drift", 0) > 0.1 * sum(chosen.values())
    assert p > 1e-3, f"hybrid trees change the output distribution (p = {p:.2e})"
