"""`--key target-est`: the ridge map, its refit schedule, the draft/target alignment of the pairs,
the draft-space shadow and the re-keying at refit."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from drift_cli.drift import DriftConfig
from drift_cli.drift.keymap import DraftShadow, KeyMapSpec, RidgeKeyMap
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods.drift import DriftMethod
from drift_kernels.reference import unit_rows
from tests.drift_books import make_books
from tests.models import tiny_llama, tiny_pair
from tests.test_drift_method import CFG, stream

TE = replace(CFG, key="target-est")
FAST = KeyMapSpec(warmup=16, refit_every=24)   # fits within the tiny streams of these tests


def linear_data(n=200, d_in=6, d_out=5, seed=0, centred=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g, dtype=torch.float64)
    if centred:
        x = x - x.mean(0)
    a = torch.randn(d_in, d_out, generator=g, dtype=torch.float64)
    b = 3.0 + torch.randn(d_out, generator=g, dtype=torch.float64)
    return x, a, b, x @ a + b


def test_ridge_fit_recovers_a_known_affine_map():
    x, a, b, y = linear_data()
    m = RidgeKeyMap(6, 5, ridge=1e-12, refit_every=1000, warmup=200)
    assert m.add(x, y) and m.fitted
    torch.testing.assert_close(m.weight.double(), a, atol=1e-5, rtol=0)
    torch.testing.assert_close(m.intercept.double(), b, atol=1e-5, rtol=0)
    torch.testing.assert_close(m.map(x.float()).double(), y, atol=1e-4, rtol=0)


def test_intercept_is_not_regularised():
    # centred inputs: the unpenalised intercept is mean(Y) whatever ρ, while the slopes shrink to 0
    x, a, b, y = linear_data(centred=True)
    m = RidgeKeyMap(6, 5, ridge=1e9, refit_every=1000, warmup=200)
    m.add(x, y)
    torch.testing.assert_close(m.intercept.double(), y.mean(0), atol=1e-5, rtol=0)
    assert m.weight.abs().max() < 1e-4
    # a penalised intercept would have been pulled towards 0: ρ (1e9 pseudo-pairs) >> n = 200
    assert (m.intercept.double() - b).abs().max() < 1e-5


def test_ridge_is_relative_to_the_feature_scale():
    x, _, _, y = linear_data()
    small, large = (RidgeKeyMap(6, 5, ridge=0.5, warmup=200) for _ in range(2))
    small.add(x, y)
    large.add(100.0 * x, y)
    torch.testing.assert_close(large.weight * 100.0, small.weight, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(large.intercept, small.intercept, atol=1e-5, rtol=1e-5)


def test_ridge_counts_as_pseudo_pairs():
    """ρ = ridge × mean feature energy per pair: the same pairs seen twice weigh against the same
    ρ, which equals one copy with half the ridge."""
    x, _, _, y = linear_data(n=40)
    y = y + torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    twice, once = RidgeKeyMap(6, 5, ridge=8.0, warmup=80), RidgeKeyMap(6, 5, ridge=4.0, warmup=40)
    twice.add(x, y)
    twice.add(x, y)
    once.add(x, y)
    torch.testing.assert_close(twice.weight, once.weight, atol=1e-6, rtol=0)
    other = RidgeKeyMap(6, 5, ridge=8.0, warmup=40)
    other.add(x, y)
    assert (other.weight - once.weight).abs().max() > 1e-3      # and the ridge does matter here


def test_refit_schedule_one_pair_at_a_time():
    x, _, _, y = linear_data(n=20)
    m = RidgeKeyMap(6, 5, refit_every=3, warmup=5)
    fits = [m.seen for i in range(20) if m.add(x[i:i + 1], y[i:i + 1])]
    assert fits == [5, 8, 11, 14, 17, 20] == m.fitted_at


def test_refit_schedule_in_chunks_fits_once_per_crossing():
    x, _, _, y = linear_data(n=20)
    m = RidgeKeyMap(6, 5, refit_every=3, warmup=5)
    assert not m.add(x[:4], y[:4]) and not m.fitted
    with pytest.raises(AssertionError, match="not fitted"):
        m.map(x[:1].float())
    assert m.add(x[4:12], y[4:12])            # 12 crosses 5, 8 and 11: one fit, using all 12 pairs
    assert m.fitted_at == [12] and m.next_fit == 14
    assert not m.add(x[12:13], y[12:13])
    assert m.add(x[13:14], y[13:14]) and m.fitted_at == [12, 14]
    # the fit uses every pair seen: equal to one fit on the 14 pairs at once
    once = RidgeKeyMap(6, 5, refit_every=3, warmup=14)
    once.add(x[:14], y[:14])
    torch.testing.assert_close(m.weight, once.weight, atol=1e-6, rtol=0)


def test_bad_key_map_settings():
    with pytest.raises(ValueError, match="ridge > 0"):
        KeyMapSpec(ridge=0.0)
    with pytest.raises(ValueError, match="warmup >= 1"):
        RidgeKeyMap(4, 4, warmup=0)


@pytest.mark.parametrize("host", [True, False], ids=["numpy-view", "torch"])
def test_shadow_is_the_rate_weighted_mean_of_raw_states(host):
    h = torch.tensor([[1.0, 2.0], [4.0, -2.0], [7.0, 3.0]])       # [P, d_in]
    s = DraftShadow(4, 2)
    if not host:
        s._host = None                                           # the device path, on the CPU
    s.allocate([(0, 2)], h)
    s.update([(1, 2), (2, 2)], [1 / 2, 1 / 3], h)                # slot 2 hit twice: rates 1/2 then 1/3
    torch.testing.assert_close(s.states[2], h.mean(0))
    s.update([(0, 2)], [0.5], h)
    torch.testing.assert_close(s.states[2], 0.5 * h.mean(0) + 0.5 * h[0])
    assert s.states[[0, 1, 3]].abs().sum() == 0


class Watching(DriftMethod):
    """Records every feedback and checks the keys right after each refit that re-keys a bank."""

    def begin_stream(self):
        super().begin_stream()
        self.feedbacks, self.rekeys = [], 0

    def observe(self, feedback):
        self.feedbacks.append((feedback, self.bank is not None))   # (feedback, did the bank see it)
        super().observe(feedback)

    def _learn_key_map(self, feedback):
        had_bank = self.bank is not None and self.bank.n_valid > 0
        fits = len(self.keymaps[self.tenant].fitted_at) if self.tenant in self.keymaps else 0
        super()._learn_key_map(feedback)
        if had_bank and len(self.keymaps[self.tenant].fitted_at) > fits:
            bank, keymap = self.bank, self.keymaps[self.tenant]
            valid = bank.valid
            keys = bank.keys[valid]
            torch.testing.assert_close(keys.norm(dim=1), torch.ones(keys.shape[0]), atol=1e-5, rtol=0)
            want = unit_rows(keymap.map(self.shadows[self.tenant].states[valid]))
            torch.testing.assert_close(keys, want, atol=1e-6, rtol=0)
            self.rekeys += 1


def watching(draft, cfg=TE, **kw):
    return Watching(draft, cfg, books_factory=make_books, backend="reference", key_map=FAST, **kw)


def test_draft_and_target_hidden_states_are_aligned():
    """With the target as its own draft, prop.hidden[:, i] is target_hidden[:, i] (not i + 1), and
    the key map accumulates exactly the pairs (prop.hidden[:, i], target_hidden[:, i]), i < k."""
    model = tiny_llama(48, 32, 2, seed=5, scale=4.0)
    method = watching(model)
    run_stream(CausalLM(model, "target"), method, stream(n_prompts=2, max_new=16), DecodeConfig(gamma=4, max_new_tokens=16))
    xs, ys, shifted = [], [], 0
    for fb, _ in method.feedbacks:
        k = fb.proposal.k
        if k == 0:
            continue
        assert fb.accepted.item() == k                       # the same model accepts everything
        h, t = fb.proposal.hidden[0], fb.target_hidden[0]    # [k, d], [k+1, d]
        torch.testing.assert_close(h, t[:k], atol=1e-5, rtol=1e-5)
        shifted += int(not torch.allclose(h, t[1:k + 1], atol=1e-3))
        xs.append(h)
        ys.append(t[:k])
    assert shifted == len(xs) > 0
    x, y = torch.cat(xs).double(), torch.cat(ys).double()
    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)
    keymap = method.keymaps["default"]
    assert keymap.seen == x.shape[0]
    torch.testing.assert_close(keymap.xtx, x1.T @ x1)
    torch.testing.assert_close(keymap.xty, x1.T @ y)


def test_refits_rekey_every_valid_prototype_and_shadows_follow_allocations():
    draft, target = tiny_pair(scale=4.0)
    method = watching(draft, replace(TE, tau=0.9))     # a high τ: some prototypes are never updated
    run = run_stream(CausalLM(target, "target"), method, stream(), DecodeConfig(gamma=4, max_new_tokens=24))
    keymap, bank, shadow = method.keymaps["default"], method.banks["default"], method.shadows["default"]
    assert method.rekeys >= 3 and len(keymap.fitted_at) == method.rekeys + 1   # the first fit creates the bank
    assert bank.dim == target.config.hidden_size and bank.n_valid > 0
    # prototypes never updated since allocation: key = unit(W·[h, 1]) of the very draft state allocated
    fresh = bank.valid & (bank.counts == 1)
    assert fresh.any()
    torch.testing.assert_close(bank.keys[fresh], unit_rows(keymap.map(shadow.states[fresh])), atol=1e-6, rtol=0)
    assert shadow.states[~bank.valid].abs().sum() == 0
    report = run.report
    assert report["key_map"]["tenants"]["default"]["fits"] == len(keymap.fitted_at)
    assert report["memory_bytes"] == bank.memory_bytes() + keymap.memory_bytes() + shadow.memory_bytes()
    d_in, d_out, n = draft.config.hidden_size, target.config.hidden_size, TE.bank_size
    assert report["key_map"]["memory_bytes"] == 8 * (d_in + 1) * (d_in + 1 + d_out) + 4 * (d_in + 1) * d_out + 4 * n * d_in


def test_shadow_is_the_running_mean_of_the_states_each_prototype_absorbed():
    """η → 0 with adaptive rates: every prototype's rate is 1/(n+1), so S_i is the plain mean of the
    draft states it absorbed and Σ_i n_i·S_i is the sum of every draft state the bank has seen
    (no evictions at these sizes). The counts come from the bank, the states from the feedback."""
    draft, target = tiny_pair(scale=4.0)
    method = watching(draft, replace(TE, eta=1e-9))
    run_stream(CausalLM(target, "target"), method, stream(), DecodeConfig(gamma=4, max_new_tokens=24))
    bank, shadow = method.banks["default"], method.shadows["default"]
    assert bank.totals.evicted == 0 and bank.totals.updated > bank.totals.allocated > 0
    seen = torch.cat([fb.proposal.hidden[0] for fb, banked in method.feedbacks if banked and fb.proposal.k])
    assert int(bank.counts.sum()) == seen.shape[0]
    total = (bank.counts[:, None].float() * shadow.states).sum(0)
    torch.testing.assert_close(total, seen.sum(0), atol=1e-3, rtol=1e-4)


def test_before_the_first_fit_the_bank_is_not_used():
    draft, target = tiny_pair(scale=4.0)
    method = Watching(draft, TE, books_factory=make_books, backend="reference", key_map=KeyMapSpec(warmup=10 ** 6))
    run = run_stream(CausalLM(target, "target"), method, stream(n_prompts=2), DecodeConfig(gamma=4, max_new_tokens=16))
    assert method.banks == {} and run.report["prototypes"] == 0
    assert run.report["key_map"]["tenants"]["default"]["pairs"] > 0
    assert run.report["memory_bytes"] == method.keymaps["default"].memory_bytes()


@pytest.mark.parametrize("option", ["bank_in", "bank_out"])
def test_snapshots_are_refused_with_target_keys(option, tmp_path):
    draft, _ = tiny_pair()
    with pytest.raises(BadInput, match="--bank-in/--bank-out are not available with --key target-est"):
        DriftMethod(draft, TE, **{option: tmp_path / "bank"})


def test_config_accepts_target_est():
    assert DriftConfig(key="target-est").validate(48).key == "target-est"
    with pytest.raises(BadInput, match="--key must be one of draft, target-est"):
        DriftConfig(key="target").validate()
