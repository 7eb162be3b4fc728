"""The DRIFT bank's update rule against hand-computed examples and a sequential re-statement."""

import math

import pytest
import torch

from drift_cli.drift import DriftBank, DriftConfig
from drift_kernels.reference import occurrence_rounds
from drift_cli.errors import BadInput
from drift_kernels import Neighbours, reference
from tests.drift_books import make_books


@pytest.fixture(params=["reference", "cpu"])
def backend(request):
    """Every bank test runs on the PyTorch path and on the numpy CPU path."""
    return request.param


def bank(n=4, d=2, m=2, v=4, backend="reference", **kw) -> DriftBank:
    kw = {"neighbors": 4, "tau": 0.95, **kw}          # the hand-computed cases assume k = 4, τ = 0.95
    cfg = DriftConfig(bank_size=n, support=m, **kw)
    with torch.inference_mode():
        return DriftBank(cfg, d, v, books=make_books(n), backend=backend)


def logs(*rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


@torch.inference_mode()
def test_allocation_then_update_by_hand(backend):
    b = bank(eta=0.1, tau=0.5, adaptive_rate=True, backend=backend)
    p = logs([0.1, 0.6, 0.2, 0.1])
    q = logs([0.5, 0.2, 0.2, 0.1])
    h = torch.tensor([[3.0, 4.0]])
    nb = b.retrieve(h)
    assert nb.idx.tolist() == [[-1] * 4]            # empty bank: nothing retrieved
    s = b.observe(h, nb, p, q)
    assert (s.allocated, s.updated) == (1, 0)
    # allocation: K = ĥ, S = top-2 tokens of max(p, q) = {1 (0.6), 0 (0.5)}, B = r on S, n = 1
    slot = 0
    assert b.support[slot].tolist() == [1, 0]
    torch.testing.assert_close(b.keys[slot], torch.tensor([0.6, 0.8]))
    r = [math.log(0.6 / 0.7) - math.log(0.2 / 0.7), math.log(0.1 / 0.7) - math.log(0.5 / 0.7)]
    torch.testing.assert_close(b.bias[slot], torch.tensor(r))
    assert b.counts[slot].item() == 1 and b.n_valid == 1
    # same region again: matched (cos 1 >= τ), rate max(0.1, 1/2) = 0.5; target's top token 1 is in S
    p2 = logs([0.3, 0.3, 0.3, 0.1])
    q2 = logs([0.25, 0.25, 0.25, 0.25])
    h2 = torch.tensor([[4.0, 3.0]])
    nb2 = b.retrieve(h2)
    assert nb2.idx[0, 0].item() == slot and abs(nb2.sim[0, 0].item() - 0.96) < 1e-6
    s = b.observe(h2, nb2, p2, q2)
    assert (s.allocated, s.updated, s.refreshed) == (0, 1, 0)
    r2 = torch.tensor([0.0, 0.0])                   # p and q are both uniform over {1, 0}
    torch.testing.assert_close(b.bias[slot], 0.5 * torch.tensor(r) + 0.5 * r2)
    key = 0.5 * torch.tensor([0.6, 0.8]) + 0.5 * torch.tensor([0.8, 0.6])
    torch.testing.assert_close(b.keys[slot], key / key.norm())
    assert b.counts[slot].item() == 2


@torch.inference_mode()
def test_support_refresh_replaces_the_smallest_bias(backend):
    b = bank(eta=0.5, tau=0.0, adaptive_rate=False, backend=backend)
    h = torch.tensor([[1.0, 0.0]])
    b.observe(h, b.retrieve(h), logs([0.4, 0.3, 0.2, 0.1]), logs([0.4, 0.3, 0.2, 0.1]))
    b.bias[0] = torch.tensor([2.0, -0.5])           # S = [0, 1]; |B| smallest at token 1
    p = logs([0.2, 0.1, 0.6, 0.1])                  # target's top token 2 is not in S
    q = logs([0.4, 0.3, 0.2, 0.1])
    s = b.observe(h, b.retrieve(h), p, q)
    assert s.refreshed == 1
    assert b.support[0].tolist() == [0, 2]
    r = [math.log(0.2 / 0.8) - math.log(0.4 / 0.6), math.log(0.6 / 0.8) - math.log(0.2 / 0.6)]
    torch.testing.assert_close(b.bias[0], 0.5 * torch.tensor([2.0, 0.0]) + 0.5 * torch.tensor(r))


def sequential_update(b: DriftBank, h, nb, logp, logq):
    """The update rule, one matched position at a time (the specification, unbatched)."""
    for p in range(h.shape[0]):
        i, s = int(nb.idx[p, 0]), float(nb.sim[p, 0])
        assert i >= 0 and s >= b.cfg.tau
        top = int(logp[p].argmax())
        sup = b.support[i]
        if top not in sup.tolist():
            j = int(b.bias[i].abs().argmin())
            sup[j], b.bias[i, j] = top, 0.0
        r = reference.support_residual(logp[p:p + 1], logq[p:p + 1], sup[None])
        reference.update(b.keys, b.bias, b.counts, torch.tensor([i]), r, h[p:p + 1], b.cfg.eta, b.cfg.adaptive_rate)


@torch.inference_mode()
def test_repeated_slots_in_one_iteration_follow_position_order(backend):
    g = torch.Generator().manual_seed(0)
    a, c = bank(n=8, d=6, m=3, v=10, tau=-1.0, backend=backend), bank(n=8, d=6, m=3, v=10, tau=-1.0)
    warm = torch.randn(3, 6, generator=g)
    lp0 = torch.log_softmax(torch.randn(3, 10, generator=g), -1)
    lq0 = torch.log_softmax(torch.randn(3, 10, generator=g), -1)
    for x in (a, c):
        x.observe(warm, x.retrieve(warm), lp0, lq0)            # three allocations
    slots = torch.tensor([2, 0, 2, 2, 1])
    nb = Neighbours(torch.stack([slots, -torch.ones_like(slots)], 1), torch.full((5, 2), 0.5), torch.ones(5, 2))
    h = torch.randn(5, 6, generator=g)
    logp = torch.log_softmax(torch.randn(5, 10, generator=g) * 3, -1)
    logq = torch.log_softmax(torch.randn(5, 10, generator=g) * 3, -1)
    a.observe(h, nb, logp, logq)
    sequential_update(c, h, nb, logp, logq)
    for name in ("keys", "support", "bias", "counts"):
        torch.testing.assert_close(getattr(a, name), getattr(c, name), atol=1e-6, rtol=0)
    assert a.counts.tolist()[:3] == [2, 2, 4]


def test_occurrence_rounds():
    assert occurrence_rounds([5, 3, 5, 5, 2]) == [[0, 1, 4], [2], [3]]
    assert occurrence_rounds([]) == []


@torch.inference_mode()
def test_full_bank_evicts_the_least_recently_used(backend):
    b = bank(n=2, d=2, m=2, tau=0.999, backend=backend)
    lp = logs([0.4, 0.3, 0.2, 0.1])
    for vec in ([1.0, 0.0], [0.0, 1.0]):
        h = torch.tensor([vec])
        b.observe(h, b.retrieve(h), lp, lp)
    h = torch.tensor([[0.0, 1.0]])                  # touches slot 1 (an update) -> slot 0 is LRU
    b.observe(h, b.retrieve(h), lp, lp)
    h = torch.tensor([[-1.0, -1.0]])                # far from both: allocate, evicting slot 0
    s = b.observe(h, b.retrieve(h), lp, lp)
    assert (s.allocated, s.evicted) == (1, 1)
    torch.testing.assert_close(b.keys[0], torch.tensor([-1.0, -1.0]) / math.sqrt(2))
    assert b.n_valid == 2


def test_memory_is_reported_exactly():
    b = bank(n=16, d=8, m=4, v=50)
    assert b.memory_bytes() == 16 * (8 * 4 + 4 * (8 + 4)) + 16 * (8 + 1)
    dense = bank(n=16, d=8, m=0, v=50)
    assert dense.memory_bytes() == 16 * (8 * 4 + 50 * 4) + 16 * (8 + 1)


@pytest.mark.parametrize("field,value,message", [
    ("gain", -1.0, "--gain must be in"), ("eta", 0.0, "--eta must be in"), ("tau", 1.5, "--tau"),
    ("neighbors", 0, "--neighbors"), ("sigma", 0.0, "--sigma"), ("bank_size", 0, "--bank-size"),
    ("support", 60, "exceeds the vocabulary"), ("key", "target", "--key must be one of"),
])
def test_bad_config_is_bad_input(field, value, message):
    with pytest.raises(BadInput, match=message):
        DriftConfig(**{field: value}).validate(vocab_size=50)


def test_config_round_trips_through_json_and_options():
    cfg = DriftConfig(gain=0.3, support=0, adaptive_rate=False)
    assert DriftConfig.from_json(cfg.to_json()) == cfg
    assert DriftConfig.from_options({"gain": 0.3, "support": 0, "adaptive_rate": False, "eta": None}) == cfg


@torch.inference_mode()
def test_unnormalised_log_probabilities_give_the_same_bank(backend):
    g = torch.Generator().manual_seed(4)
    a, c = bank(n=8, d=6, m=3, v=10, tau=0.2, backend=backend), bank(n=8, d=6, m=3, v=10, tau=0.2, backend=backend)
    for _ in range(4):
        h = torch.randn(3, 6, generator=g)
        zp, zq = torch.randn(3, 10, generator=g) * 3, torch.randn(3, 10, generator=g) * 3
        shift = torch.randn(3, 1, generator=g) * 50                 # logits: any per-row constant
        a.observe(h, a.retrieve(h), torch.log_softmax(zp, -1), torch.log_softmax(zq, -1))
        c.observe(h, c.retrieve(h), zp + shift, zq - shift)
    assert a.n_valid == c.n_valid > 0 and torch.equal(a.support, c.support)
    torch.testing.assert_close(a.bias, c.bias, atol=1e-4, rtol=0)
    torch.testing.assert_close(a.keys, c.keys, atol=1e-6, rtol=0)


@pytest.mark.parametrize("m", [3, 0])
@torch.inference_mode()
def test_cpu_bank_iteration_on_the_engines_tensors_matches_the_reference(m):
    """A batch of 2 at T = 0.8 on the CPU path as the engine drives it (draft steps on strided
    [B, d] / [B, V] views, then the update read in place from the iteration's [B, γ(+1), ·] tensors
    with the recorded retrievals reordered batch-major) leaves the bank as the reference does,
    with a sparse support (m = 3) and with full-vocabulary biases (m = 0)."""
    g = torch.Generator().manual_seed(7)
    d, v, steps, temp = 6, 10, 3, 0.8
    kw = dict(n=16, d=d, m=m, v=v, tau=0.5, neighbors=2, gain=1.5)
    fast, ref = bank(backend="cpu", **kw), bank(backend="reference", **kw)
    assert fast.native and ref.cpu is None
    empty = Neighbours(torch.full((2, 2), -1), torch.full((2, 2), float("-inf")), torch.zeros(2, 2))
    seen = []
    for _ in range(5):
        hidden = torch.randn(2, steps, d, generator=g)
        draft_logits = torch.randn(2, steps, v, generator=g) * 3
        target_logits = torch.randn(2, steps + 1, v, generator=g) * 3
        fast.begin_draft()
        found = []
        for t in range(steps):
            z = draft_logits[:, t] / temp
            out, _ = fast.draft_step(hidden[:, t], z)                   # hidden[:, t]: row stride γ·d
            want, nb = ref.draft_step(hidden[:, t].contiguous(), z)
            torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
            found.append(nb if nb is not None else empty)
        recorded = fast.drafted(2, steps)
        by_batch = Neighbours(*(torch.stack([getattr(nb, f) for nb in found], 1).reshape(2 * steps, 2)
                                for f in ("idx", "sim", "weight")))
        assert torch.equal(torch.from_numpy(recorded.idx), by_batch.idx)
        got = fast.observe_drafted(hidden, target_logits, draft_logits, steps, temp)
        want = ref.observe(hidden.reshape(2 * steps, d), by_batch, target_logits[:, :steps].reshape(-1, v) / temp,
                           draft_logits.reshape(-1, v) / temp)
        assert got == want                       # the same record: matched pairs, rates, allocations, ...
        seen.append(want)
    assert fast.n_valid == ref.n_valid > 0 and fast.hi == ref.hi
    assert torch.equal(fast.counts, ref.counts) and torch.equal(fast.valid, ref.valid)
    if m:
        assert torch.equal(fast.support, ref.support)
    torch.testing.assert_close(fast.keys, ref.keys, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.bias, ref.bias, atol=1e-4, rtol=0)
    assert fast.totals == ref.totals and fast.totals.updated > 0
    assert any(o.matched and o.allocations and o.newly_valid for o in seen)     # every part exercised


@torch.inference_mode()
def test_the_update_with_the_triton_ema_step_equals_the_reference():
    """`reference.observe` with the Triton EMA kernel (interpreted on the CPU) leaves the bank as
    the pure reference does and reports the same record."""
    from functools import partial

    import drift_kernels
    from drift_kernels import reference

    g = torch.Generator().manual_seed(3)
    kw = dict(n=6, d=8, m=4, v=12, tau=0.3, neighbors=2)
    tri, ref = bank(backend="triton", **kw), bank(backend="reference", **kw)
    assert tri.cpu is None and ref.cpu is None
    for _ in range(6):
        h = torch.randn(4, 8, generator=g)
        nb = reference.retrieve(h, ref.keys[:ref.hi], ref.valid[:ref.hi], 2, ref.cfg.sigma)
        zp, zq = torch.randn(4, 12, generator=g) * 2, torch.randn(4, 12, generator=g) * 2
        want = reference.observe(ref.books, ref.tenant, ref.arrays, h, zp, zq, nb, ref.rule)
        got = reference.observe(tri.books, tri.tenant, tri.arrays, h, zp, zq, nb, tri.rule,
                                ema=partial(drift_kernels.update, backend="triton"))
        assert got == want
    assert ref.n_valid == 6 and int(ref.counts.max()) > 1                # filled up, and prototypes updated
    assert torch.equal(tri.counts, ref.counts) and torch.equal(tri.support, ref.support)
    torch.testing.assert_close(tri.keys, ref.keys, atol=1e-6, rtol=0)
    torch.testing.assert_close(tri.bias, ref.bias, atol=1e-6, rtol=0)
