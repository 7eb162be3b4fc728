"""`osd`: exactness with a changing draft, the frozen control, the alignment, memory accounting."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
import torch

from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.engine.sampling import Sampler
from drift_cli.errors import BadInput
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.base import Feedback, MethodContext
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.buffer import BufferEntry, ReplayBuffer, dense_target, entries_from_feedback
from drift_cli.osd.config import OSDConfig
from drift_cli.osd.trainer import DraftTrainer, batch_loss, logits_at, pack
from drift_cli.stream import Prompt, Stream
from tests.models import tiny_pair

FAST = OSDConfig(interval=2, steps=2, batch=8, lr=1e-2, buffer=64, topk=0)


def _stream(prompt_lengths, vocab=48, max_new=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [Prompt(tuple(torch.randint(0, vocab, (n,), generator=g).tolist()), f"d{i}") for i, n in enumerate(prompt_lengths)]
    return Stream("unit", "test", prompts, max_new)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_weights(model: torch.nn.Module, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, snap[k]) for k, v in model.state_dict().items())


# -- the engine-level guarantees ----------------------------------------------------------------

@pytest.mark.parametrize("scale, cfg", [
    (1.0, FAST),
    (8.0, OSDConfig(interval=1, steps=1, batch=4, lr=1e-2, topk=5, all_positions=True, divergence="jsd")),
])
def test_greedy_output_equals_ar_while_the_draft_learns(scale, cfg):
    draft, target = tiny_pair(scale=scale)
    shared = _snapshot(draft)
    grad_flags = [p.requires_grad for p in draft.parameters()]
    stream = _stream([1, 17], max_new=20)
    dcfg = DecodeConfig(gamma=4, max_new_tokens=20)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, dcfg)
    policy = OnlineDistillation(draft, cfg)
    osd = run_stream(lm, policy, stream, dcfg)
    assert [g.output_ids for g in osd.generations] == [g.output_ids for g in ar.generations]
    assert osd.report["updates"] == len(osd.steps) // int(cfg.interval) > 0
    assert not _same_weights(policy.student, shared)          # the copy learned
    assert _same_weights(draft, shared)                        # the shared draft did not
    assert [p.requires_grad for p in draft.parameters()] == grad_flags


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_infinite_interval_reproduces_vanilla_step_by_step(temperature):
    draft, target = tiny_pair(scale=4.0)
    stream = _stream([2, 9], max_new=16, seed=1)
    dcfg = DecodeConfig(gamma=3, max_new_tokens=16, temperature=temperature, seed=7)
    lm = CausalLM(target, "target")
    va = run_stream(lm, Vanilla(draft), stream, dcfg)
    osd = run_stream(lm, OnlineDistillation(draft, OSDConfig(interval=math.inf)), stream, dcfg)
    assert [(s.drafted, s.accepted) for s in osd.steps] == [(s.drafted, s.accepted) for s in va.steps]
    assert [g.output_ids for g in osd.generations] == [g.output_ids for g in va.generations]
    assert osd.report["updates"] == 0 and osd.report["buffer_entries"] == 0


def test_begin_stream_restores_the_shared_draft():
    draft, target = tiny_pair()
    shared = _snapshot(draft)
    stream = _stream([3, 6], max_new=16)
    policy = OnlineDistillation(draft, FAST)
    first = run_stream(CausalLM(target, "target"), policy, stream, DecodeConfig(gamma=4, max_new_tokens=16))
    assert first.report["updates"] > 0 and not _same_weights(policy.student, shared)
    policy.begin_stream()
    assert _same_weights(policy.student, shared)
    assert len(policy.buffer) == 0 and policy.trainer.state_bytes() == 0


# -- alignment ------------------------------------------------------------------------------------

def _one_step(policy: OnlineDistillation, target, context: list[int], gamma: int, accepted: int) -> Feedback:
    """Draft gamma tokens after context with the policy and build the feedback of a verification
    that accepted `accepted` of them (the target scores [last, x1..xk] as the engine does)."""
    ctx = torch.tensor([context])
    policy.begin_prompt(ctx)
    prop = policy.propose(ctx, gamma, Sampler())
    with torch.inference_mode():
        logits = target(torch.cat([ctx, prop.tokens], 1)).logits[:, -(gamma + 1):].float()
    acc = torch.tensor([accepted])
    return Feedback(ctx, prop, logits, acc, logits[:, accepted].argmax(-1), Sampler(), step=0)


def test_trained_logits_are_those_that_proposed_the_rejected_token():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, OSDConfig(topk=0))
    context = [3, 14, 15, 9, 2, 6]
    fb = _one_step(policy, target, context, gamma=4, accepted=2)     # x3 (slot 2) rejected
    (entry,) = entries_from_feedback(fb, topk=0, all_positions=False)
    assert entry.ids.tolist() == context + fb.proposal.tokens[0, :2].tolist()
    assert torch.equal(entry.logprobs, torch.log_softmax(fb.target_logits[0, 2], -1))
    trained = logits_at(policy.student, pack([entry])).detach()[0]
    # The logits trained are the ones the draft drew x3 from, not the next position's (OSD's off-by-one).
    torch.testing.assert_close(trained, fb.proposal.base_logits[0, 2], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(trained, fb.proposal.base_logits[0, 3], atol=1e-2)
    assert fb.proposal.tokens[0, 2] == trained.argmax()


def test_all_positions_buffers_every_drafted_slot_in_order():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, OSDConfig())
    fb = _one_step(policy, target, [5, 7, 1], gamma=3, accepted=3)
    assert entries_from_feedback(fb, 0, all_positions=False) == []           # all accepted: nothing wrong
    entries = entries_from_feedback(fb, 0, all_positions=True)
    assert [e.ids.tolist() for e in entries] == [[5, 7, 1] + fb.proposal.tokens[0, :j].tolist() for j in range(3)]
    trained = logits_at(policy.student, pack(entries)).detach()
    torch.testing.assert_close(trained, fb.proposal.base_logits[0], rtol=1e-4, atol=1e-4)


def test_sampling_mode_buffers_the_tempered_target():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, OSDConfig())
    fb = _one_step(policy, target, [4, 4, 8], gamma=2, accepted=0)
    fb.sampler = Sampler(temperature=0.5)
    (entry,) = entries_from_feedback(fb, 0, all_positions=False)
    assert torch.allclose(entry.logprobs, torch.log_softmax(fb.target_logits[0, 0] / 0.5, -1))


# -- buffer, packing, loss ----------------------------------------------------------------------

def test_topk_target_is_renormalised_over_its_support():
    logp = torch.log_softmax(torch.tensor([2.0, 0.0, 1.0, -1.0, 0.5]), -1)
    vals, idx = logp.topk(2)
    dense = dense_target([BufferEntry(torch.tensor([1]), vals, idx)], 5)[0]
    assert torch.isinf(dense[[1, 3, 4]]).all()
    torch.testing.assert_close(dense.exp().sum(), torch.tensor(1.0))
    torch.testing.assert_close(dense[0] - dense[2], logp[0] - logp[2])
    full = dense_target([BufferEntry(torch.tensor([1]), logp, None)], 5)[0]
    assert torch.equal(full, logp)


def test_topk_or_full_storage():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, OSDConfig())
    fb = _one_step(policy, target, [1, 2, 3], gamma=2, accepted=0)
    (small,) = entries_from_feedback(fb, 7, False)
    (full,) = entries_from_feedback(fb, 48, False)               # K >= V: the whole distribution
    assert small.support.tolist() == fb.target_logits[0, 0].topk(7).indices.tolist()
    assert full.support is None and full.logprobs.shape == (48,)


def test_buffer_is_fifo_and_bounded():
    buf = ReplayBuffer(3)
    buf.extend([BufferEntry(torch.tensor([i]), torch.zeros(2), None) for i in range(5)])
    assert [int(e.ids[0]) for e in buf.entries] == [2, 3, 4] and buf.added == 5
    picks = buf.sample(10, torch.Generator().manual_seed(0))
    assert sorted(int(e.ids[0]) for e in picks) == [2, 3, 4]


def test_packing_shares_prefix_rows_and_matches_separate_forwards():
    draft, _ = tiny_pair()
    seq = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    other = torch.tensor([2, 7, 1, 8])
    entries = [BufferEntry(ids, torch.zeros(1), None) for ids in (seq[:3], other, seq, seq[:6], other[:1])]
    batch = pack(entries)
    assert batch.ids.shape == (2, 8)                                 # two distinct sequences
    assert batch.col.tolist() == [2, 3, 7, 5, 0]
    with torch.no_grad():
        packed = logits_at(draft, batch)
        alone = torch.stack([draft(e.ids[None]).logits[0, -1] for e in entries])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tvd"])
def test_updates_reduce_the_loss_on_a_fixed_buffer(kind):
    draft, target = tiny_pair()
    student = copy.deepcopy(draft).requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(32)
    with torch.no_grad():
        for n in (4, 7, 9, 12):
            ids = torch.randint(0, 48, (n,), generator=g)
            buf.extend([BufferEntry(ids, torch.log_softmax(target(ids[None]).logits[0, -1], -1), None)])
    trainer = DraftTrainer(student, OSDConfig(steps=20, batch=4, lr=1e-2, divergence=kind))
    entries = list(buf.entries)
    before = float(batch_loss(student, entries, kind, 1.0).detach())
    trainer.update(buf, 1.0, g)
    after = float(batch_loss(student, entries, kind, 1.0).detach())
    assert after < 0.7 * before


# -- cache rebuild and accounting ---------------------------------------------------------------

def test_cache_is_rebuilt_under_the_new_weights():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, FAST)
    fb = _one_step(policy, target, [9, 3, 3, 7, 1], gamma=3, accepted=1)
    committed = torch.cat([fb.context, fb.proposal.tokens[:, :1], fb.next_token[:, None]], 1)
    policy.commit(committed)
    policy.buffer.extend(entries_from_feedback(fb, 0, True))
    policy._update(1.0)
    assert policy.lm.cache_len == committed.shape[1] - 1
    after = policy.propose(committed, 3, Sampler())
    fresh = Vanilla(copy.deepcopy(policy.student))
    fresh.begin_prompt(committed)
    expect = fresh.propose(committed, 3, Sampler())
    assert torch.equal(after.tokens, expect.tokens)
    torch.testing.assert_close(after.base_logits, expect.base_logits, rtol=1e-5, atol=1e-5)


def test_report_accounts_adamw_and_gradient_memory():
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, FAST)
    run = run_stream(CausalLM(target, "target"), policy, _stream([4, 8], max_new=16), DecodeConfig(gamma=4, max_new_tokens=16))
    rep = run.report
    numel = sum(p.numel() for p in draft.parameters())
    tensors = len(list(draft.parameters()))
    assert rep["draft_copy_bytes"] == 4 * numel
    assert rep["gradient_bytes"] == 4 * numel
    assert rep["optimizer_state_bytes"] == 2 * 4 * numel + 4 * tensors      # two fp32 moments + a step scalar each
    assert rep["buffer_entries"] == len(policy.buffer) and rep["buffer_bytes"] == policy.buffer.nbytes > 0
    assert rep["memory_bytes"] == rep["draft_copy_bytes"] + rep["optimizer_state_bytes"] + rep["buffer_bytes"] + rep["gradient_bytes"]
    assert len(rep["loss_per_update"]) == rep["updates"] > 0
    assert rep["update_ms_total"] == pytest.approx(rep["train_ms_total"] + rep["rebuild_ms_total"])
    assert rep["config"]["interval"] == 2
    # the update iterations carry the update cost in their adaptation time
    fired = [s.adapt_ms for s in run.steps if (s.step + 1) % 2 == 0]
    quiet = [s.adapt_ms for s in run.steps if (s.step + 1) % 2]
    assert statistics.median(fired) > 10 * statistics.median(quiet)


# -- configuration --------------------------------------------------------------------------------

def test_options_and_validation():
    assert OSDConfig.from_options({"osd_lr": None, "divergence": "rkl", "osd_interval": float("inf")}) == OSDConfig(divergence="rkl", interval=math.inf)
    assert OSDConfig(interval=math.inf).to_json()["interval"] == "inf"
    for bad, msg in [(dict(interval=0), "--osd-interval"), (dict(interval=2.5), "--osd-interval"),
                     (dict(steps=0), "--osd-steps"), (dict(lr=0.0), "--osd-lr"), (dict(topk=-1), "--osd-topk")]:
        with pytest.raises(BadInput, match=msg):
            OSDConfig(**bad).validate()
    with pytest.raises(BadInput, match="did you mean 'fkl'"):
        OSDConfig(divergence="fk").validate()
    ctx = MethodContext(draft=None, draft_path=None, draft_fingerprint=None, eos_id=None, vocab_size=48)
    with pytest.raises(BadInput, match="needs a draft"):
        OnlineDistillation.build(ctx)
    from drift_cli.commands.options import method_cli_options

    names = [o.name for o in method_cli_options("osd")]
    assert {"divergence", "osd_interval", "osd_lr", "osd_all_positions"} <= set(names)   # --divergence: shared with offline


@pytest.mark.stats
def test_sampling_stays_lossless_while_the_draft_learns():
    """Speculative sampling with a draft that changes every fourth step still samples the target
    (chi-square over the first two tokens, significance 1e-3; see tests/exactness.py)."""
    from tests.exactness import SIGNIFICANCE, sampling_p_value

    draft, target = tiny_pair(vocab=8, seed=11)
    cfg = OSDConfig(interval=4, steps=1, batch=4, lr=3e-2, topk=0)
    policies: list[OnlineDistillation] = []
    make = lambda: policies.append(OnlineDistillation(draft, cfg)) or policies[-1]  # noqa: E731
    p = sampling_p_value(target, make, [1, 5, 2], n_tokens=2, samples=1000, temperature=0.8)
    assert policies[0].stats.updates > 100
    assert p > SIGNIFICANCE


def test_cli_flags_parse_into_the_config():
    import click
    from click.testing import CliRunner

    from drift_cli.commands.options import settings_options
    from drift_cli.methods.offline import OfflineConfig

    seen = {}
    cmd = click.Command("bench", params=settings_options([OSDConfig, OfflineConfig]),
                        callback=lambda **kw: seen.update(kw))
    res = CliRunner().invoke(cmd, ["--osd-interval", "inf", "--osd-lr", "1e-3", "--osd-topk", "0",
                                   "--osd-all-positions", "--divergence", "tvd"])
    assert res.exit_code == 0, res.output
    cfg = OSDConfig.from_options(seen).validate()
    assert cfg == OSDConfig(interval=math.inf, lr=1e-3, topk=0, all_positions=True, divergence="tvd")
    CliRunner().invoke(cmd, [])
    assert OSDConfig.from_options(seen) == OSDConfig()


# -- what an update trains -----------------------------------------------------------------------

SUBSET = sorted(set(range(0, 48, 2)) | {1, 3, 5})


def test_a_compact_head_gives_the_full_heads_logits():
    from drift_cli.engine.head import OutputHead, compact_head
    from tests.models import tiny_llama

    draft = tiny_llama(48, 32, 2, 1, 4.0)
    draft.config.draft_vocab_ids = SUBSET
    small = copy.deepcopy(draft)
    compact_head(small)
    hidden = torch.randn(3, 5, 32)
    assert small.get_output_embeddings().weight.shape == (len(SUBSET), 32)
    assert torch.equal(OutputHead(small)(hidden), OutputHead(draft)(hidden))


@pytest.mark.parametrize("subset", [None, SUBSET])
def test_train_last_updates_only_the_last_layer_norm_and_head_and_stays_lossless(subset):
    from dataclasses import replace

    from tests.models import tiny_llama

    draft, target = tiny_llama(48, 32, 2, 1, 4.0), tiny_llama(48, 48, 2, 0, 4.0)
    if subset:
        draft.config.draft_vocab_ids = subset
    shared = _snapshot(draft)
    stream = _stream([2, 11], max_new=20)
    dcfg = DecodeConfig(gamma=4, max_new_tokens=20)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, dcfg)
    policy = OnlineDistillation(draft, replace(FAST, train="last"))
    osd = run_stream(lm, policy, stream, dcfg)
    assert [g.output_ids for g in osd.generations] == [g.output_ids for g in ar.generations]
    assert osd.report["updates"] > 0
    learned = policy.student.state_dict()
    frozen = [k for k in learned if k.startswith(("model.embed_tokens", "model.layers.0."))]
    assert frozen and all(torch.equal(learned[k], shared[k]) for k in frozen)
    assert any(not torch.equal(learned[k], shared[k]) for k in learned if k.startswith("model.layers.1."))
    head = learned["lm_head.weight"]
    assert head.shape[0] == (len(subset) if subset else 48)
    assert not torch.equal(head, shared["lm_head.weight"][subset] if subset else shared["lm_head.weight"])
    layer = sum(p.numel() for p in draft.get_decoder().layers[-1].parameters())
    assert osd.report["trained_parameters"] == layer + 32 + head.numel()
    policy.begin_stream()                                          # restored from the shared draft
    restored = policy.student.state_dict()
    assert all(torch.equal(v, shared[k][subset] if v.shape != shared[k].shape else shared[k])
               for k, v in restored.items())
    assert _same_weights(draft, shared)


@pytest.mark.parametrize("subset", [None, SUBSET])
def test_train_head_updates_only_the_head_never_re_prefills_and_stays_lossless(subset):
    from dataclasses import replace

    from tests.models import tiny_llama

    draft, target = tiny_llama(48, 32, 2, 1, 4.0), tiny_llama(48, 48, 2, 0, 4.0)
    if subset:
        draft.config.draft_vocab_ids = subset
    shared = _snapshot(draft)
    stream = _stream([2, 11], max_new=20)
    dcfg = DecodeConfig(gamma=4, max_new_tokens=20)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, dcfg)
    policy = OnlineDistillation(draft, replace(FAST, train="head"))
    prefills = []
    rebuild = policy._rebuild_cache
    policy._rebuild_cache = lambda: prefills.append(1) or rebuild()
    osd = run_stream(lm, policy, stream, dcfg)
    assert [g.output_ids for g in osd.generations] == [g.output_ids for g in ar.generations]
    assert osd.report["updates"] > 0 and not prefills and osd.report["rebuild_ms_total"] == 0
    learned = policy.student.state_dict()
    assert all(torch.equal(learned[k], shared[k]) for k in learned if k != "lm_head.weight")
    head = learned["lm_head.weight"]
    assert head.shape[0] == (len(subset) if subset else 48)
    assert not torch.equal(head, shared["lm_head.weight"][subset] if subset else shared["lm_head.weight"])
    assert osd.report["trained_parameters"] == head.numel()


def test_a_kept_hidden_state_gives_the_loss_the_packed_forward_gives():
    """--osd-train head: entries keep the head's input, and the trainer's loss from it is the loss
    of the packed forward over the contexts (the layers below the head are frozen)."""
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, OSDConfig(topk=0))
    fb = _one_step(policy, target, [5, 7, 1, 9], gamma=3, accepted=3)
    kept = entries_from_feedback(fb, 0, all_positions=True, keep_hidden=True)
    plain = entries_from_feedback(fb, 0, all_positions=True)
    assert all(e.hidden is not None for e in kept) and all(e.hidden is None for e in plain)
    for e, j in zip(kept, range(3)):
        assert torch.equal(e.hidden, fb.proposal.hidden[0, j])
    torch.testing.assert_close(batch_loss(policy.student, kept, "fkl", 1.0),
                               batch_loss(policy.student, plain, "fkl", 1.0), rtol=1e-4, atol=1e-5)
