"""EAGLE heads as drafts: the layouts read, the target states handed over, losslessness of every
draft-model method on a head at several batch sizes, the head's per-row rollback, no extra target
pass, OSD training the head alone, and the refusals of heads that do not fit their target.

The heads are written by tests/eagle_writer.py in the vLLM / SpecForge layouts (random weights),
then trained for a few seconds on the tiny target's own labels (`drift_cli.eagle.train`) so that
greedy runs accept blocks (EOS inside some)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from drift_cli.eagle.drafter import HeadDrafter
from drift_cli.eagle.load import load_head, save_head
from drift_cli.eagle.train import agreement, init_eagle3, train_on_labels
from drift_cli.engine.head import OUTSIDE
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.engine.policy import Rows
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import last_positions
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.hybrid import Hybrid
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.config import OSDConfig
from drift_cli.zoo.pretrained import Labels, continuations, frequent_tokens, label_windows
from tests.eagle_writer import reference_logits, write_eagle1, write_eagle3
from tests.models import tiny_llama
from tests.recording import unit_stream
from tests.test_batch import DRIFT_CFG, GAMMA, MAX_NEW, PROMPTS, SCALE

VOCAB = 48
AUX = [0, 2, 3]                    # of the 4-layer tiny target
EOS = 38                           # this target's: ends 5 of the 10 prompts, after repeats a head drafts through


def _labels(target, layers, seed: int = 3) -> Labels:
    """The tiny target's top-8 and its states at `layers`: random windows, its greedy continuations
    of random prefixes and of the test prompts (trajectories the heads then draft on)."""
    g = torch.Generator().manual_seed(seed)
    width = 24
    own = [continuations(target, torch.tensor([p]), width - len(p), 8, None, layers=layers) for p in PROMPTS]
    return Labels.cat([label_windows(target, torch.randint(0, VOCAB, (16, width), generator=g), 8, 8, layers=layers),
                       continuations(target, torch.randint(0, VOCAB, (48, 3), generator=g), width - 3, 8, None,
                                     layers=layers), *own])


def _trained(path, target, labels, epochs: int, seed: int, ttt: int = 1):
    """The head written at `path`, loaded, trained on `labels`, saved and loaded back."""
    head = load_head(path, target)
    train_on_labels(head, labels, epochs=epochs, batch=8, lr=1e-2, warmup=5, ttt_steps=ttt, seed=seed)
    return load_head(save_head(head, path.parent / f"{path.name}-trained"), target)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("heads")
    target = tiny_llama(VOCAB, 48, 4, 0, SCALE)
    l3, l1 = _labels(target, tuple(AUX)), _labels(target, (4,))
    subset = sorted(set(frequent_tokens(l3, 32, VOCAB)) | {EOS})
    e3 = write_eagle3(root / "eagle3", target, draft_vocab=subset, aux=AUX)
    e1 = write_eagle1(root / "eagle1", target)
    return {
        "target": target, "subset": subset,
        "eagle3": _trained(e3, target, l3, 30, 0, ttt=2), "eagle3-offline": _trained(e3, target, l3, 10, 1),
        "eagle": _trained(e1, target, l1, 30, 0), "eagle-offline": _trained(e1, target, l1, 10, 1),
    }


METHODS = {
    "vanilla": lambda h, o: Vanilla(h),
    "drift": lambda h, o: DriftMethod(h, DRIFT_CFG),
    "offline": lambda h, o: Offline(o),
    "osd": lambda h, o: OnlineDistillation(h, OSDConfig(interval=2.0, steps=1, batch=4)),
    "hybrid": lambda h, o: Hybrid(SuffixDecoding(), Vanilla(h)),
}


def _run(heads, kind: str, method: str, batch: int, eos: int | None = EOS):
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=eos, batch_size=batch)
    policy = Autoregressive() if method == "ar" else METHODS[method](heads[kind], heads[f"{kind}-offline"])
    target = CausalLM(heads["target"], "target")
    return run_stream(target, policy, unit_stream(PROMPTS, MAX_NEW), cfg), policy, target


@pytest.fixture(scope="module")
def reference(heads):
    run, _, _ = _run(heads, "eagle3", "ar", 1)
    return [g.output_ids for g in run.generations]


# -- the layouts and the target states --------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2])
def test_captured_states_are_hugging_faces_hidden_states(batch):
    """Index k < L is the input of layer k, L the final state after the norm; in the batch-1
    DynamicCache path and the batched RowCache path, prefill and a later step alike."""
    target = tiny_llama(VOCAB, 48, 4, 0)
    lm = CausalLM(target, "t")
    lm.capture((0, 2, 4))
    lm.reset_rows(batch)
    seqs = [torch.tensor([3, 9, 4, 7, 1]), torch.tensor([5, 6, 2])][:batch]
    got = []
    for s, ids in enumerate(seqs):
        lm.forward_rows([s], [ids[:-1]])
        got.append(lm.features[0])
    lm.forward_rows(list(range(batch)), [ids[-1:] for ids in seqs])
    for s, ids in enumerate(seqs):
        with torch.inference_mode():
            hs = target(input_ids=ids[None], output_hidden_states=True).hidden_states
        want = torch.cat([hs[0][0], hs[2][0], hs[4][0]], -1)
        torch.testing.assert_close(torch.cat([got[s], lm.features[s, :1]]), want, rtol=1e-5, atol=1e-5)
    lm.capture(())
    lm.forward_rows([0], [torch.tensor([1])])
    assert lm.features is None and not lm._hooks


@pytest.mark.parametrize("kind", ["eagle3", "eagle3-reduced", "eagle3-own-embed", "eagle", "eagle-2-layers"])
def test_a_head_computes_what_its_layout_says(kind, tmp_path):
    """The loaded head, prefilled over a sequence through the drafter, gives the logits of the
    writer's plain reference forward (which reads the target's states from Hugging Face)."""
    target = tiny_llama(VOCAB, 48, 4, 0, 4.0)
    write = {"eagle3": lambda p: write_eagle3(p, target, aux=AUX),
             "eagle3-reduced": lambda p: write_eagle3(p, target, draft_vocab=list(range(3, VOCAB, 2)), aux=[1, 1, 3]),
             "eagle3-own-embed": lambda p: write_eagle3(p, target, own_embed=True, norm_before_residual=True,
                                                        architecture=None),
             "eagle": lambda p: write_eagle1(p, target),
             "eagle-2-layers": lambda p: write_eagle1(p, target, layers=2, fc_bias=False, architecture=None)}[kind]
    path = write(tmp_path / kind)
    head = load_head(path, target)
    ids = [1, 5, 9, 3, 7, 2, 8, 11, 4, 4, 30]
    want = reference_logits(path, target, ids)
    lm = CausalLM(target, "t")
    lm.capture(head.target_layers)
    lm.reset()
    lm.forward(torch.tensor([ids[:-1]]))
    drafter = HeadDrafter(head)
    drafter.reset_rows(3)
    drafter.add_features(2, lm.features[0])
    _, z = drafter.forward_rows([2], [torch.tensor(ids[1:])])
    inside = torch.isfinite(want)
    torch.testing.assert_close(z[0][inside], want[inside], rtol=1e-4, atol=1e-4)
    assert bool((z[0][~inside] == OUTSIDE).all())


# -- losslessness ------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 8])
@pytest.mark.parametrize("method", ["vanilla", "drift", "offline", "osd"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_greedy_on_a_head_equals_ar(heads, reference, kind, method, batch):
    run, policy, _ = _run(heads, kind, method, batch)
    assert run.complete and [g.output_ids for g in run.generations] == reference
    steps = run.steps
    assert sum(s.accepted for s in steps) > 0 and max(s.batch for s in steps) == batch
    if batch > 1:
        assert any(g.steps[0].step > 0 for g in run.generations)
    # a one-token prompt has no target state before its first verification: it drafts nothing then
    one = [g for g in run.generations if len(g.prompt_ids) == 1]
    assert one and all(g.steps[0].drafted == 0 for g in one)
    if method == "osd":
        assert policy.stats.updates > 0


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_hybrid_with_a_head_as_its_model_source_equals_ar(heads, reference, kind):
    run, policy, _ = _run(heads, kind, "hybrid", 3)
    assert [g.output_ids for g in run.generations] == reference
    assert policy.model_steps > 0 and policy.copied_steps > 0


@pytest.mark.parametrize("batch", [1, 3])
def test_a_target_change_stream_hands_the_new_targets_states_to_the_head(heads, batch):
    """After the switch the changed target records the same layers: greedy output equals ar's on
    the same switched stream, and the head still drafts (and gets accepted) after it."""
    changed = copy.deepcopy(heads["target"])
    with torch.no_grad():
        for w in changed.parameters():
            w.add_(0.02 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=batch)

    def run(policy):
        return run_stream(CausalLM(heads["target"], "target"), policy, unit_stream(PROMPTS, MAX_NEW), cfg,
                          switch=(5, CausalLM(changed, "target")))

    ar, head = run(Autoregressive()), run(Vanilla(heads["eagle3"]))
    assert [g.output_ids for g in head.generations] == [g.output_ids for g in ar.generations]
    after = [s for g in head.generations[5:] for s in g.steps]
    assert sum(s.drafted for s in after) > 0 and sum(s.accepted for s in after) > 0


def test_eos_inside_a_drafted_block_is_exercised(heads):
    found = []
    for kind in ("eagle", "eagle3"):
        run, _, _ = _run(heads, kind, "vanilla", 3)
        found.append(any(g.hit_eos and g.steps[-1].emitted <= g.steps[-1].accepted for g in run.generations))
    assert any(found), found


def test_the_trained_heads_agree_with_the_target(heads):
    """The fixture's heads are not random: their acceptance makes the equality tests above bite."""
    for kind in ("eagle", "eagle3"):
        run, _, _ = _run(heads, kind, "vanilla", 1)
        drafted, accepted = sum(s.drafted for s in run.steps), sum(s.accepted for s in run.steps)
        assert accepted / drafted > 0.15, (kind, accepted, drafted)


# -- no extra target pass ---------------------------------------------------------------------------

class Watch:
    """Marks the policy's calls, and records in which the target ran a forward."""

    def __init__(self, policy, target: CausalLM) -> None:
        self.inside, self.calls, self.depth = False, [], 0
        for name in ("begin_prompt", "propose", "commit", "observe", "end_prompt"):
            setattr(policy, name, self._mark(getattr(policy, name)))
        for name in ("forward", "forward_rows"):
            setattr(target, name, self._record(getattr(target, name)))

    def _mark(self, fn):
        def call(*a, **kw):
            self.inside = True
            try:
                return fn(*a, **kw)
            finally:
                self.inside = False
        return call

    def _record(self, fn):
        def call(*a, **kw):                       # a pass, once (batch 1's forward_rows runs forward)
            if not self.depth:
                self.calls.append(self.inside)
            self.depth += 1
            try:
                return fn(*a, **kw)
            finally:
                self.depth -= 1
        return call


@pytest.mark.parametrize("batch", [1, 3])
def test_a_head_adds_no_target_pass(heads, batch):
    """The target runs a prefill per admitted prompt (of more than one token) and one pass per
    iteration, never inside the policy, on a head as on a draft model; at batch 1 it is fed
    exactly the prefills and [last, x1..xk] per iteration, as vanilla on a draft model is."""
    from drift_cli.methods.base import ModelDraftPolicy

    def counted(policy):
        cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=batch)
        target = CausalLM(heads["target"], "target")
        watch = Watch(policy, target)
        run = run_stream(target, policy, unit_stream(PROMPTS, MAX_NEW), cfg)
        iterations = len({s.step for s in run.steps})
        prefills = [len(p) - 1 for p in PROMPTS if len(p) > 1]
        assert not any(watch.calls) and len(watch.calls) == len(prefills) + iterations
        assert target.forward_calls == len(prefills) + iterations
        if batch == 1:
            assert target.forward_tokens == sum(prefills) + sum(s.drafted + 1 for s in run.steps)
        return run

    head = counted(Vanilla(heads["eagle3"]))
    layer = counted(ModelDraftPolicy(tiny_llama(VOCAB, 32, 1, 1, SCALE)))
    assert sum(s.drafted for s in head.steps) > 0 and sum(s.drafted for s in layer.steps) > 0


# -- the head's cache: per-row rollback ------------------------------------------------------------

def test_rejected_drafts_leave_the_head_as_a_fresh_prefill(heads):
    """Two iterations at batch 3, rows accepting none, some and all of their drafts: after each
    commit every row's next logits equal a fresh prefill over its committed sequence, and the
    head's cache holds only entries fed with the target's own states."""
    head, target = heads["eagle3"], heads["target"]
    lm = CausalLM(target, "t")
    lm.capture(head.target_layers)

    def states(ids: torch.Tensor) -> torch.Tensor:
        lm.reset()
        lm.forward(ids[None])
        return lm.features[0]                                           # [L, F]

    policy = Vanilla(head)
    policy.begin_batch(3)
    ids = [torch.tensor(p) for p in ([3, 9, 4, 3, 9], [5, 6, 7, 8, 5, 6, 2, 11, 5], [12, 13])]
    for s, p in enumerate(ids):
        policy.slot, policy.prompt_features = s, states(p)[:-1]
        policy.begin_prompt(p[None])
    drafter = policy.lm
    for accepted, nxt in (([0, 2, 4], [7, 11, 13]), ([4, 0, 1], [2, 3, 5])):
        prop = policy.propose(Rows([0, 1, 2], ids, [None] * 3), 4, Sampler())
        assert prop.k == 4 and all(drafter.rows.lengths[s] > drafter.real[s] for s in range(3))
        new = [torch.cat([c, prop.tokens[b, :a], torch.tensor([n])]) for b, (c, a, n) in enumerate(zip(ids, accepted, nxt))]
        scored = [states(n)[len(c) - 1:len(n) - 1] for c, n in zip(ids, new)]
        policy.commit(Rows([0, 1, 2], new, [None] * 3, features=scored))
        assert [drafter.rows.lengths[s] for s in range(3)] == [len(c) - 1 for c in ids]     # the real pairs only
        assert drafter.real == [len(c) - 1 for c in ids] and drafter.known == [len(n) - 1 for n in new]
        ids = new
        feed = [c[drafter.row_len(s):] for s, c in enumerate(ids)]
        before = copy.deepcopy(drafter.rows.lengths), copy.deepcopy(drafter.real), list(drafter._carry)
        _, z = drafter.forward_rows([0, 1, 2], feed)
        live = last_positions(z, feed)
        for b, c in enumerate(ids):
            fresh = HeadDrafter(head)
            fresh.add_features(0, states(c)[:-1])
            _, want = fresh.forward_rows([0], [c[1:]])
            torch.testing.assert_close(live[b], want[0, -1], rtol=1e-4, atol=1e-4)
        drafter.rows.lengths, drafter.real, drafter._carry = before[0], before[1], before[2]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_refill_holds_what_a_full_prefill_holds(heads, kind):
    """`refill_row` (OSD's re-prefill after a weight change: the keys/values alone but for the
    last pair) over a stale row leaves the cache, the real count and the carry a full forward over
    every pair leaves, and the next draft step's logits equal."""
    head, target = heads[kind], heads["target"]
    lm = CausalLM(target, "t")
    lm.capture(head.target_layers)
    ids = torch.tensor([3, 9, 4, 3, 9, 5, 6, 7, 8, 5, 6, 2, 11, 5])
    lm.forward(ids[None])
    states = lm.features[0]
    full, refilled = HeadDrafter(head), HeadDrafter(head)
    for d in (full, refilled):
        d.reset_rows(2)
        d.add_features(1, states[:-1])
    full.forward_rows([1], [ids[1:-1]])
    refilled.forward_rows([1], [torch.tensor([7, 7, 1, 2, 30, 31, 5])])   # entries of other tokens, then the refill
    refilled.refill_row(1, ids)
    n = len(ids) - 2
    assert full.rows.lengths[1] == refilled.rows.lengths[1] == n and full.real[1] == refilled.real[1] == n
    torch.testing.assert_close(refilled.carry(1), full.carry(1), rtol=1e-5, atol=1e-5)
    for store in ("keys", "values"):
        for a, b in zip(getattr(full.rows, store), getattr(refilled.rows, store), strict=True):
            torch.testing.assert_close(b[1, :, :n], a[1, :, :n], rtol=1e-5, atol=1e-5)
    steps = [d.forward_rows([1], [ids[-1:]])[1] for d in (full, refilled)]
    torch.testing.assert_close(steps[1], steps[0], rtol=1e-4, atol=1e-4)


# -- OSD trains the head alone ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_osd_on_a_head_updates_head_parameters_only(heads, kind):
    target, head = heads["target"], heads[kind]
    before_target = {n: w.clone() for n, w in target.named_parameters()}
    before_head = {n: w.clone() for n, w in head.named_parameters()}
    policy = OnlineDistillation(head, OSDConfig(interval=1.0, steps=2, batch=4, lr=1e-2, all_positions=True))
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=2)
    run = run_stream(CausalLM(target, "target"), policy, unit_stream(PROMPTS, MAX_NEW), cfg)
    assert policy.stats.updates > 0 and all(e.features is not None for e in policy.buffer.entries)
    assert all(torch.equal(w, before_target[n]) for n, w in target.named_parameters())       # the target: frozen
    assert all(torch.equal(w, before_head[n]) for n, w in head.named_parameters())           # the shared head too
    trained = {n for n, w in policy.student.named_parameters() if w.requires_grad}
    expect = {n for n, w in policy.student.named_parameters() if any(w is t for t in policy.student.trainable_parameters())}
    assert trained == expect and trained
    changed = {n for n, w in policy.student.named_parameters() if not torch.equal(w, before_head[n])}
    assert changed and changed <= trained
    assert not {id(w) for w in policy.trainer.params} & {id(w) for w in target.parameters()}
    assert policy.student.get_input_embeddings() is target.get_input_embeddings()          # borrowed, not copied
    assert run.report["trained_parameters"] == sum(policy.student.get_parameter(n).numel() for n in trained)
    assert run.report["trained_parameters"] < sum(w.numel() for w in target.parameters())


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_async_osd_on_a_head_swaps_refills_and_stays_lossless(heads, reference, kind, batch):
    """osd --osd-async on a head: the decoder waits (here, in the test) for the first version
    once, so that a swap and its re-prefill of the rows' head caches certainly happen."""
    import threading

    policy = OnlineDistillation(heads[kind], OSDConfig(interval=2.0, steps=1, batch=4, background=True))
    policy.begin_stream()
    published = threading.Event()
    policy.worker.on_publish = lambda w: published.set()
    observe = policy.observe

    def observing(feedback):
        observe(feedback)
        if policy.worker.stats.requested == 1:
            assert published.wait(60)
    policy.observe = observing
    policy.begin_stream = lambda: None                         # keep the hooked worker
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS, batch_size=batch)
    run = run_stream(CausalLM(heads["target"], "target"), policy, unit_stream(PROMPTS, MAX_NEW), cfg)
    assert [g.output_ids for g in run.generations] == reference
    assert run.report["swaps"] >= 1 and run.report["rebuild_ms_total"] > 0
    assert not policy.worker.alive


def test_a_head_restarts_each_stream_from_the_shared_head(heads):
    policy = OnlineDistillation(heads["eagle3"], OSDConfig(interval=1.0, steps=2, batch=4, lr=1e-2))
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=EOS)
    first = run_stream(CausalLM(heads["target"], "target"), policy, unit_stream(PROMPTS[:4], MAX_NEW), cfg)
    second = run_stream(CausalLM(heads["target"], "target"), policy, unit_stream(PROMPTS[:4], MAX_NEW), cfg)
    assert [s.accepted for s in first.steps] == [s.accepted for s in second.steps]


# -- the build recipe's pieces --------------------------------------------------------------------

def test_label_passes_record_the_heads_states_without_another_pass():
    """The labels carry the target's states at every labelled position, from the labelling passes
    themselves: as many target forwards as without them, and the states of a plain pass."""
    target = tiny_llama(VOCAB, 48, 4, 0, SCALE)
    calls = []
    target.model.embed_tokens.register_forward_hook(lambda *a: calls.append(1))   # once a forward, on either path
    g = torch.Generator().manual_seed(0)
    rows, prefixes = torch.randint(0, VOCAB, (4, 12), generator=g), torch.randint(0, VOCAB, (3, 4), generator=g)
    plain = [label_windows(target, rows, 4, 2), continuations(target, prefixes, 6, 4, None)]
    n_plain = len(calls)
    calls.clear()
    rich = [label_windows(target, rows, 4, 2, layers=(0, 2, 4)), continuations(target, prefixes, 6, 4, None, layers=(0, 2, 4))]
    assert len(calls) == n_plain
    for a, b in zip(plain, rich):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.top_ids, b.top_ids)
        with torch.inference_mode():
            hs = target(input_ids=b.ids, output_hidden_states=True).hidden_states
        want = torch.cat([hs[0], hs[2], hs[4]], -1)
        assert b.features.dtype == torch.float16 and b.features.shape == want.shape
        torch.testing.assert_close(b.features.float(), want, rtol=2e-3, atol=2e-3)


def test_a_head_initialised_from_its_target_trains_and_round_trips(tmp_path):
    target = tiny_llama(VOCAB, 48, 4, 0, SCALE)
    labels = _labels(target, tuple(AUX))
    vocab = frequent_tokens(labels, 24, VOCAB)
    head = init_eagle3(target, vocab, tuple(AUX))
    layer = target.model.layers[-1]
    assert torch.equal(head.midlayer.mlp.down_proj.weight, layer.mlp.down_proj.weight)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[torch.tensor(vocab)])
    assert torch.equal(head.d2t + torch.arange(24), torch.tensor(vocab)) and int(head.t2d.sum()) == 24
    before = agreement(head, labels)
    curve = train_on_labels(head, labels, epochs=10, batch=8, lr=3e-3, warmup=2, ttt_steps=3)
    assert curve[-1][1] < curve[0][1] and agreement(head, labels) > before + 0.1
    assert not any(w.requires_grad for w in head.parameters())
    path = save_head(head, tmp_path / "head")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 24
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX
    from safetensors.torch import load_file

    names = set(load_file(str(path / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names and not any(n.startswith("rotary") for n in names)
    back = load_head(path, target)
    assert torch.equal(reference_logits(path, target, [1, 2, 3, 4, 5]).isfinite().sum(-1), torch.full((4,), 24))
    with torch.inference_mode():
        x, f = labels.ids[:2], labels.features[:2, :-1].float()
        torch.testing.assert_close(back.teacher_forced(x, f), head.teacher_forced(x, f))


def test_the_unrolled_steps_attend_as_drafting_does():
    """Training-time test, step s, position i: the first step's keys up to i - s and one key of
    each later step (its own drafting chain): the mask a draft of s + 1 tokens sees."""
    from drift_cli.eagle.modules import causal_mask

    m = causal_mask(4, 2, torch.float32, "cpu")[0, 0] == 0                  # [4, 12]
    assert m.shape == (4, 12)
    assert m[3].tolist() == [True, True, False, False] + [False, False, True, False] + [False, False, False, True]
    assert m[0].tolist() == [False] * 4 + [False] * 4 + [True, False, False, False]
    assert torch.equal(causal_mask(3, 0, torch.float32, "cpu")[0, 0] == 0, torch.ones(3, 3, dtype=torch.bool).tril())
