"""Batch > 1: continuous batching over the stream, ragged proposals and per-row rollback.

Greedy outputs equal `ar`'s at batch 1 for every method at B in {1, 2, 3, 8} in fp32, with
prompts of different lengths (one of a single token: no prefill), rows that finish at different
times (EOS or budget), EOS inside a drafted block, and rows admitted mid-stream. Tenants' banks
stay apart inside one batch.
"""

from __future__ import annotations

import pytest
import torch

from drift_cli.drift.config import DriftConfig
from drift_cli.drift.keymap import KeyMapSpec
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.offline import Offline
from drift_cli.methods.osd import OnlineDistillation
from drift_cli.methods.pld import PromptLookup
from drift_cli.methods.suffix import SuffixDecoding
from drift_cli.methods.vanilla import Vanilla
from drift_cli.osd.config import OSDConfig
from tests.drift_books import make_books
from tests.models import tiny_llama, tiny_pair
from tests.recording import unit_stream

SCALE = 8.0          # sharp distributions: long agreements, so blocks get accepted (and hold EOS)
EOS = 24             # ends 6 of the 10 prompts, some of them inside an accepted drafted block
MAX_NEW = 20
GAMMA = 4
# lengths 1..12, repeats (so the model-free drafters find matches), 10 prompts: B = 8 admits mid-stream too
PROMPTS = [[3, 9, 4, 3, 9, 4, 3, 9], [1], [5, 6, 7, 8, 5, 6, 2, 11, 5, 6, 7, 8], [3, 9, 4], [12, 13],
           [20, 21, 22, 20, 21], [1, 2, 3, 4, 5, 6, 1, 2, 3], [30], [3, 9, 4, 3, 9], [40, 41, 42, 43, 40, 41, 42]]
DRIFT_CFG = DriftConfig(gain=2.0, tau=0.3, sigma=1.0, bank_size=64, support=8)

METHODS = {
    "ar": lambda d, o: Autoregressive(),
    "vanilla": lambda d, o: Vanilla(d),
    "drift": lambda d, o: DriftMethod(d, DRIFT_CFG),
    "drift-reference": lambda d, o: DriftMethod(d, DRIFT_CFG, books_factory=make_books, backend="reference"),
    "drift-target-est": lambda d, o: DriftMethod(d, DriftConfig(key="target-est", gain=2.0, tau=0.3, sigma=1.0,
                                                                bank_size=64, support=8),
                                                 books_factory=make_books, backend="reference",
                                                 key_map=KeyMapSpec(warmup=16, refit_every=24)),
    "offline": lambda d, o: Offline(o),
    "osd": lambda d, o: OnlineDistillation(d, OSDConfig(interval=2.0, steps=1, batch=4)),
    "pld": lambda d, o: PromptLookup(),
    "suffix": lambda d, o: SuffixDecoding(),
}


@pytest.fixture(scope="module")
def models():
    draft, target = tiny_pair(scale=SCALE)
    return draft, tiny_llama(48, 32, 1, 5, SCALE), target


def _run(models, method: str, batch: int, prompts=PROMPTS, tenants=None, eos: int | None = EOS):
    draft, other, target = models
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=MAX_NEW, eos_id=eos, batch_size=batch)
    policy = METHODS[method](draft, other)
    return run_stream(CausalLM(target, "target"), policy, unit_stream(prompts, MAX_NEW, tenants), cfg), policy


@pytest.fixture(scope="module")
def reference(models):
    """ar at batch 1: the outputs every method at every batch size must reproduce."""
    run, _ = _run(models, "ar", 1)
    outputs = [g.output_ids for g in run.generations]
    # the stream has what the test is about: rows ending by EOS and by budget, at different lengths
    assert any(g.hit_eos for g in run.generations) and not all(g.hit_eos for g in run.generations)
    assert len({len(o) for o in outputs}) > 2
    return outputs


@pytest.mark.parametrize("batch", [1, 2, 3, 8])
@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_equals_ar_at_every_batch_size(models, reference, method, batch):
    run, _ = _run(models, method, batch)
    assert run.complete and [g.prompt_index for g in run.generations] == list(range(len(PROMPTS)))
    assert [g.output_ids for g in run.generations] == reference
    steps = run.steps
    assert max(s.batch for s in steps) == batch
    if method != "ar":
        assert sum(s.accepted for s in steps) > 0
    if batch > 1:
        # rows admitted mid-stream: a prompt whose first iteration is not the stream's first
        assert any(g.steps[0].step > 0 for g in run.generations)
        assert len({s.slot for s in steps}) == batch


@pytest.mark.parametrize("method", ["vanilla", "drift", "suffix"])
def test_eos_inside_a_drafted_block_is_exercised(models, reference, method):
    """Some row's last iteration accepted a drafted EOS (emitted <= accepted: the correction
    token after it was cut), at batch 3."""
    run, _ = _run(models, method, 3)
    assert any(g.hit_eos and g.steps[-1].emitted <= g.steps[-1].accepted for g in run.generations)


def test_batch_one_records_what_it_always_recorded(models):
    run, _ = _run(models, "vanilla", 1)
    assert all(s.batch == 1 and s.slot == 0 for s in run.steps)
    assert [s.step for s in run.steps] == list(range(len(run.steps)))


def test_rows_share_the_iteration_time(models):
    run, _ = _run(models, "vanilla", 3)
    by_step: dict[int, list] = {}
    for s in run.steps:
        by_step.setdefault(s.step, []).append(s)
    for rows in by_step.values():
        assert len(rows) == rows[0].batch and len({r.total_ms for r in rows}) == 1
        assert len({r.slot for r in rows}) == len(rows)
    assert all(g.latency_ms >= g.decode_ms > 0 for g in run.generations)
    assert run.wall_ms >= max(g.finished_ms for g in run.generations)


class Recording(DriftMethod):
    """Records, per iteration, every row's drafted tokens by its prompt's tenant."""

    def begin_stream(self):
        super().begin_stream()
        self.seen = []

    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        n = prop.lengths
        self.seen.append({s: (self.slot_tenants[s], prop.tokens[b, :n[b]].tolist())
                          for b, s in enumerate(context.slots)})
        return prop


class Frozen(Recording):
    """Tenant a's bank never learns."""

    def _observe_tenant(self, feedback, rows):
        if self.tenant != "a":
            super()._observe_tenant(feedback, rows)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_tenants_stay_apart_in_one_batch(models, backend):
    """B = 4, rows of two tenants in every iteration: tenant a's updates change a's proposals but
    never b's (the same b rows propose the same tokens whether a's bank learns or not)."""
    draft, _, target = models
    prompts = [[3, 9, 4, 3, 9], [5, 6, 7, 8, 5], [3, 9, 4, 1], [5, 6, 2, 11]]
    tenants = ["a", "b", "a", "b"]
    cfg = DecodeConfig(gamma=GAMMA, max_new_tokens=40, batch_size=4)
    runs = {}
    for name, cls in (("learning", Recording), ("frozen", Frozen)):
        kw = {"books_factory": make_books, "backend": "reference"} if backend == "reference" else {}
        policy = cls(draft, DRIFT_CFG, **kw)
        run_stream(CausalLM(target, "target"), policy, unit_stream(prompts, 40, tenants), cfg)
        runs[name] = policy

    def of(policy, tenant):
        return [{s: t for s, (who, t) in it.items() if who == tenant} for it in policy.seen]

    learning, frozen = runs["learning"], runs["frozen"]
    b_learning, b_frozen = of(learning, "b"), of(frozen, "b")
    n = min(len(b_learning), len(b_frozen))
    assert n > 3 and b_learning[:n] == b_frozen[:n]
    assert of(learning, "a") != of(frozen, "a")
    assert learning.banks["a"].n_valid > 0 and frozen.banks["a"].n_valid == 0 and learning.banks["b"].n_valid > 0


@pytest.mark.parametrize("batch", [2, 8])
def test_osd_buffer_fills_from_every_row(models, batch):
    run, policy = _run(models, "osd", batch)
    drafted_rows = {s.prompt for s in run.steps if s.accepted < s.drafted}
    assert policy.buffer.added > 0 and len(drafted_rows) > 1
    assert policy.stats.updates > 0


def test_divergence_records_the_first_position_and_the_top2_gap(models):
    from dataclasses import replace

    from drift_cli.engine.diverge import divergences, first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1 and first_difference([1, 2], [1, 2, 3]) == 2
    _, _, target = models
    ar, _ = _run(models, "ar", 1, eos=None)
    bent = [replace(g, output_ids=g.output_ids[:3] + [(g.output_ids[3] + 1) % 48] + g.output_ids[4:])
            if g.prompt_index == 2 else g for g in ar.generations]
    found = divergences(target, bent, ar.generations)
    assert [(d["prompt"], d["position"]) for d in found] == [(2, 3)]
    g = ar.generations[2]
    with torch.inference_mode():
        z = target(torch.tensor([list(g.prompt_ids) + g.output_ids[:3]])).logits[0, -1]
    top = torch.topk(z, 2).values
    assert found[0]["top2_gap"] == pytest.approx(float(top[0] - top[1])) and found[0]["top2_gap"] >= 0


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "0"], "--batch-size': must be >= 1, got 0"),
    (["--batch-sizes", "1,x"], "--batch-sizes must be comma-separated integers"),
    (["--batch-sizes", "2,2"], "--batch-sizes': must list distinct sizes >= 1"),
])
def test_bad_batch_sizes_are_one_line_errors(args, message, capsys, tmp_path):
    from drift_cli.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "--zoo", "micro", "--out", str(tmp_path), *args])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bench_batch_sizes_writes_the_curve(tmp_path, capsys):
    """`drift bench --batch-sizes 1,2`: every method at each size, one table block and one PNG."""
    import json

    from drift_cli.cli import main
    from tests.models import saved_pair

    d, t = saved_pair(tmp_path / "pair")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--corpus", "/usr/share/common-licenses", "--draft", str(d), "--target", str(t),
              "--methods", "vanilla,pld", "--max-prompts", "3", "--max-new-tokens", "8", "--batch-sizes", "1,2",
              "--out", str(tmp_path / "out"), "--json"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    run = json.loads(out)
    rows = run["batch_curve"]["rows"]
    assert [(r["batch_size"], r["method"]) for r in rows] == [(b, m) for b in (1, 2) for m in ("ar", "vanilla", "pld")]
    assert all(r["ar_match_rate"] == 1.0 for r in rows if r["method"] != "ar")
    assert all(r["throughput_tokens_per_s"] > 0 and r["latency_ms_p99"] >= r["latency_ms_p50"] > 0 for r in rows)
    assert run["methods"]["vanilla"]["batch_size"] == 1
    runs = list((tmp_path / "out").rglob("batch-curve.png"))
    assert len(runs) == 1
    steps = [json.loads(line) for line in open(runs[0].parent / "steps.jsonl")]
    assert {s["scope"] for s in steps} == {"main", "batch2"} and max(s["batch"] for s in steps) == 2


def test_row_cache_rolls_rows_back_to_their_own_lengths():
    """Rows of different lengths, fed different counts, rolled back by different amounts: each
    row's next logits equal a fresh batch-1 pass over its committed sequence (no re-prefill)."""
    model = tiny_llama(48, 48, 2, 0)
    rows, single = CausalLM(model), CausalLM(model)
    rows.reset_rows(3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 48, (n,), generator=g) for n in (5, 9, 2)]
    for s, p in enumerate(prompts):
        rows.forward_rows([s], [p])                       # one row's prefill
    rows.forward_rows([0, 1, 2], [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])])
    rows.crop_rows([0, 1, 2], [6, 10, 3])                 # keep 1 of 3, all of 1, 1 of 2
    assert [rows.row_len(s) for s in range(3)] == [6, 10, 3]
    feeds = [torch.tensor([7, 8]), torch.tensor([9]), torch.tensor([10, 11, 12])]
    _, z = rows.forward_rows([0, 2, 1], feeds)            # any subset, any order of slots
    committed = [torch.cat([prompts[0], torch.tensor([1])]), torch.cat([prompts[2], torch.tensor([5])]),
                 torch.cat([prompts[1], torch.tensor([4])])]
    for i, (c, f) in enumerate(zip(committed, feeds, strict=True)):
        single.reset()
        _, want = single.forward(torch.cat([c, f])[None])
        torch.testing.assert_close(z[i, :len(f)], want[0, -len(f):], rtol=1e-5, atol=1e-5)


def test_proposal_fit_and_ragged_layout():
    from drift_cli.methods.base import Proposal, ragged

    p = ragged([[1, 2, 3], [], [4]], "cpu")
    assert p.tokens.tolist() == [[1, 2, 3], [0, 0, 0], [4, 0, 0]] and p.lengths == [3, 0, 1]
    assert ragged([[1, 2], [3, 4]], "cpu").num_draft is None          # uniform rows: no num_draft
    cut = p.fit([2, 0, 1])
    assert cut.k == 2 and cut.lengths == [2, 0, 1]
    full = Proposal(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert full.fit([3, 3]) is full and full.fit([2, 2]).num_draft is None and full.fit([2, 2]).k == 2
