"""`osd --osd-async`: updates on a background worker, swapped in at iteration boundaries.

Every interleaving the tests need is forced with events (`BackgroundTrainer.hold`, `on_step`,
`on_publish`), never with sleeps: an update that finishes in the middle of a decode step, a
worker held while the stream runs, an interrupt while an update is in progress.
"""

from __future__ import annotations

import threading

import pytest
import torch

from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.config import OSDConfig
from drift_cli.osd.worker import THREAD_NAME
from tests.models import tiny_pair
from tests.test_osd import _snapshot, _stream

ASYNC = OSDConfig(interval=1, steps=2, batch=8, lr=1e-2, buffer=64, topk=0, background=True)
WAIT_S = 60          # a bound on waiting for an event the other thread will set (never reached when correct)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def _held(policy: OnlineDistillation) -> threading.Event:
    """Hold the stream's worker before each update until the returned event is set."""
    gate = threading.Event()
    policy.worker.hold = gate
    return gate


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("train", ["all", "head"])
def test_greedy_async_equals_ar(batch, train):
    draft, target = tiny_pair(scale=4.0)
    shared = _snapshot(draft)
    stream = _stream([1, 17, 5, 9, 3], max_new=16)
    dcfg = DecodeConfig(gamma=4, max_new_tokens=16, batch_size=batch)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, dcfg)
    policy = OnlineDistillation(draft, OSDConfig(**{**ASYNC.__dict__, "train": train}))
    published = []
    policy.begin_stream()
    policy.worker.on_publish = published.append
    run = _run_keeping_worker(lm, policy, stream, dcfg)
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]
    rep = run.report
    assert rep["updates"] == len(published) and rep["updates_requested"] == len({s.step for s in run.steps})
    assert rep["swaps"] <= rep["updates"]
    assert sum(rep["staleness_histogram"].values()) == len(policy.stats.staleness) > 0
    assert rep["worker_seconds"] > 0.0 and rep["worker_threads"] == torch.get_num_threads()
    assert not _workers()                                     # joined at the end of the stream
    assert all(torch.equal(v, shared[k]) for k, v in draft.state_dict().items())   # the shared draft untouched


def _run_keeping_worker(lm, policy, stream, dcfg, **kw):
    """run_stream without its begin_stream (which would replace the worker the test hooked)."""
    begin = policy.begin_stream
    policy.begin_stream = lambda: None
    try:
        return run_stream(lm, policy, stream, dcfg, **kw)
    finally:
        policy.begin_stream = begin


def test_a_held_worker_never_stalls_the_decoder():
    """The worker is held before its first update for the whole stream: every step still runs,
    the output is ar's, nothing was published or swapped, and the requests piled up."""
    draft, target = tiny_pair(scale=4.0)
    stream = _stream([3, 8, 5], max_new=20)
    dcfg = DecodeConfig(gamma=3, max_new_tokens=20)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), stream, dcfg)
    policy = OnlineDistillation(draft, ASYNC)
    policy.begin_stream()
    gate = _held(policy)
    run = _run_keeping_worker(lm, policy, stream, dcfg)
    assert run.complete and [g.output_ids for g in run.generations] == [g.output_ids for g in ar.generations]
    rep = run.report
    assert rep["updates"] == 0 and rep["swaps"] == 0
    assert rep["updates_requested"] == len(run.steps) > 10
    # the draft never changed: vanilla's steps exactly, and a staleness that only grows
    va = run_stream(lm, Vanilla(draft), stream, dcfg)
    assert [(s.drafted, s.accepted) for s in run.steps] == [(s.drafted, s.accepted) for s in va.steps]
    stale = policy.stats.staleness
    assert stale == sorted(set(stale)) and stale[0] == 0 and stale[-1] < len(run.steps)
    assert not gate.is_set() and not _workers()


def test_an_update_finishing_mid_step_does_not_reach_that_steps_proposal():
    """The worker publishes while the decoder is between two draft forwards of one proposal:
    that proposal's tokens and q' come from the version it started with (recomputed here from
    the recorded version's weights), the next proposal swaps the new version in."""
    draft, target = tiny_pair(vocab=16, seed=3, scale=2.0)
    stream = _stream([4, 6], vocab=16, max_new=24)
    dcfg = DecodeConfig(gamma=4, max_new_tokens=24, temperature=1.0, seed=5)
    lm = CausalLM(target, "target")
    policy = OnlineDistillation(draft, OSDConfig(**{**ASYNC.__dict__, "interval": 2}))
    policy.begin_stream()
    versions = {0: {k: v.detach().clone() for k, v in policy.student.named_parameters()}}
    published = threading.Event()

    def on_publish(w):
        versions[w.version] = {**versions[0], **w.tensors}
        published.set()

    gate = _held(policy)
    policy.worker.on_publish = on_publish
    forward = policy.lm.forward_rows
    calls = {"n": 0, "mid": None}
    records = []                                          # (version at propose, context, proposal)

    def forward_rows(slots, feed, **kw):
        calls["n"] += 1
        # the second draft forward of the first proposal after an update was requested
        if calls["mid"] is None and policy.worker.stats.requested and calls["n"] == 2:
            calls["mid"] = len(records)
            gate.set()                                    # the worker may update now ...
            assert published.wait(WAIT_S)                 # ... and has published before this forward
            policy.worker.hold = threading.Event()        # later updates stay held
        return forward(slots, feed, **kw)

    propose = policy.propose

    def recording(context, gamma, sampler):
        version_before = policy.version
        calls["n"] = 0
        prop = propose(context, gamma, sampler)
        records.append((version_before, policy.version, [c.clone() for c in context.ids], prop))
        return prop

    policy.lm.forward_rows = forward_rows
    policy.propose = recording
    run = _run_keeping_worker(lm, policy, stream, dcfg)
    assert run.complete and calls["mid"] is not None
    mid = calls["mid"]
    _, used, ctx, prop = records[mid]
    assert used == 0                                      # swapped only at a boundary: not this proposal
    assert records[mid + 1][1] == 1 and records[mid + 1][0] == 0   # the next one swapped version 1 in
    for _, version, ctx, prop in records[mid:mid + 2]:
        _check_proposal_from(draft, versions[version], ctx[0], prop, dcfg.temperature)


def _check_proposal_from(draft, weights, context, prop, temperature):
    """q' of every drafted position equals the softmax of a fresh draft copy with `weights`."""
    import copy

    model = copy.deepcopy(draft)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in weights.items():
            params[name].copy_(value)
    k = prop.lengths[0]
    ids = torch.cat([context, prop.tokens[0, :k]])[None]
    with torch.inference_mode():
        logits = model(ids).logits[0, len(context) - 1: len(context) - 1 + k].float()
    q = torch.softmax(logits / temperature, -1)
    torch.testing.assert_close(prop.q[0, :k], q, rtol=1e-4, atol=1e-5)


def test_an_interrupt_during_an_update_leaves_no_worker_and_keeps_what_finished():
    """Ctrl-C lands while the worker is inside an update (after its first AdamW step): the
    stream stops marked incomplete with the prompts that finished, the worker is joined, and the
    cut update is not published."""
    draft, target = tiny_pair(scale=4.0)
    stream = _stream([3, 5, 7, 4], max_new=12)
    dcfg = DecodeConfig(gamma=3, max_new_tokens=12)
    lm = CausalLM(target, "target")
    policy = OnlineDistillation(draft, OSDConfig(**{**ASYNC.__dict__, "steps": 3}))
    policy.begin_stream()
    worker = policy.worker
    inside = threading.Event()

    def on_step(i):                                       # inside the update until told to stop
        inside.set()
        while not worker.stopping:
            threading.Event().wait(0.01)

    worker.on_step = on_step
    done: list[int] = []
    observe = policy.observe

    def observing(feedback):
        observe(feedback)
        if done and done[-1] >= 1 and worker.stats.requested:      # a prompt has finished
            assert inside.wait(WAIT_S)
            raise KeyboardInterrupt
    policy.observe = observing
    run = _run_keeping_worker(lm, policy, stream, dcfg, on_prompt=lambda n, *_: done.append(n))
    assert not run.complete and 1 <= len(run.generations) < len(stream.prompts)
    assert not _workers() and not worker.alive
    assert run.report["updates"] == 0 and run.report["swaps"] == 0


def test_knobs():
    assert OSDConfig.from_options({"osd_async": True, "osd_threads": 2}) == OSDConfig(background=True, threads=2)
    with pytest.raises(BadInput, match="--osd-threads .* needs --osd-async"):
        OSDConfig(threads=2).validate()
    with pytest.raises(BadInput, match="--osd-threads"):
        OSDConfig(background=True, threads=0).validate()
    assert OSDConfig(background=True).to_json()["background"] is True


def test_sync_osd_reports_its_staleness_too():
    draft, target = tiny_pair()
    stream = _stream([3, 6], max_new=16)
    cfg = OSDConfig(interval=2, steps=1, batch=8, lr=1e-2, buffer=64, topk=0)
    run = run_stream(CausalLM(target, "target"), OnlineDistillation(draft, cfg), stream, DecodeConfig(gamma=4, max_new_tokens=16))
    hist = run.report["staleness_histogram"]
    assert set(hist) == {"0", "1"}                           # updated every second step: 0 then 1 steps stale
    assert "worker_seconds" not in run.report


@pytest.mark.stats
def test_sampling_stays_lossless_with_background_updates():
    """Chi-square over the first two tokens while finished weights land between iterations."""
    from tests.exactness import SIGNIFICANCE, sampling_p_value

    draft, target = tiny_pair(vocab=8, seed=11)
    cfg = OSDConfig(interval=2, steps=1, batch=4, lr=3e-2, topk=0, background=True)
    policies: list[OnlineDistillation] = []
    make = lambda: policies.append(OnlineDistillation(draft, cfg)) or policies[-1]  # noqa: E731
    try:
        p = sampling_p_value(target, make, [1, 5, 2], n_tokens=2, samples=1000, temperature=0.8)
    finally:
        policies[0].close()
    assert policies[0].stats.swaps > 20
    assert p > SIGNIFICANCE


# -- the fair budget and the command line ----------------------------------------------------------

def test_background_load_works_beside_the_caller_and_stops():
    from drift_cli.engine.load import THREAD_NAME as LOAD, BackgroundLoad

    draft, _ = tiny_pair()
    with BackgroundLoad(draft) as load:
        for _ in range(WAIT_S * 100):                          # progress of the other thread, bounded
            if load.matmuls >= 3:
                break
            threading.Event().wait(0.01)
    rep = load.report()
    assert rep["matmuls"] >= 3 and rep["seconds"] > 0
    assert rep["shape"][1] == [32, 48]                          # [d, V]: the tiny draft's output head, transposed
    assert not [t for t in threading.enumerate() if t.name == LOAD]


def test_bench_records_the_worker_and_the_load(tmp_path, capsys):
    import json

    from tests.models import saved_pair
    from tests.test_cli import bench_args, run_cli

    pair = saved_pair(tmp_path / "pair")
    code, out, err = run_cli(bench_args(pair, tmp_path / "runs", "--methods", "vanilla,osd", "--osd-async",
                                        "--osd-interval", "1", "--background-load", "--no-control", "--json"), capsys)
    assert code == 0, err
    run = json.loads(out)
    osd, vanilla = run["methods"]["osd"], run["methods"]["vanilla"]
    assert osd["report"]["config"]["background"] is True and osd["ar_match_rate"] == 1.0
    assert {"swaps", "worker_seconds", "staleness_mean", "staleness_histogram"} <= set(osd["report"])
    assert vanilla["report"]["background_load"]["matmuls"] >= 0 and vanilla["decode_seconds"] > 0
    assert not _workers()
    code, out, err = run_cli(["report", str(tmp_path / "runs" / run["scenario"] / run["run_id"])], capsys)
    assert code == 0 and "second thread" in out


def test_a_failing_worker_fails_the_run_in_the_decoder():
    """An exception inside an update reaches the decoder at its next boundary (not a draft that
    silently stops learning)."""
    draft, target = tiny_pair()
    policy = OnlineDistillation(draft, ASYNC)
    policy.begin_stream()
    failed = threading.Event()

    def boom(step):
        failed.set()
        raise ValueError("injected")
    policy.worker.on_step = boom
    observe = policy.observe

    def observing(feedback):
        observe(feedback)
        assert failed.wait(WAIT_S)                             # the worker has failed before the next proposal
    policy.observe = observing
    with pytest.raises(RuntimeError, match="osd worker failed: ValueError"):
        _run_keeping_worker(CausalLM(target, "target"), policy, _stream([3, 6], max_new=24),
                            DecodeConfig(gamma=3, max_new_tokens=24))
    policy.close()
    assert not _workers()
