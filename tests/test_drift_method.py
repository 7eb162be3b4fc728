"""The `drift` method in the engine: losslessness, no gradients, tenant isolation, snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from drift_cli.drift import DriftConfig
from drift_cli.drift.keymap import KeyMapSpec
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.drift import DriftMethod
from drift_cli.stream import Prompt, Stream
from tests.drift_books import RustBooks, make_books
from tests.models import tiny_pair

# A bank that fills and retrieves quickly at these tiny sizes: a low τ so prototypes get updated,
# a wide kernel so neighbours carry weight, a large gain so the bias changes proposals.
CFG = DriftConfig(gain=2.0, tau=0.3, sigma=1.0, bank_size=64, support=8)
# --key target-est: a ridge map fitted within these tiny streams (the defaults wait 256 positions)
FAST_KEY_MAP = KeyMapSpec(warmup=16, refit_every=24)
KEYS = ["draft", "target-est"]


def stream(n_prompts=4, length=6, max_new=24, tenants=None, seed=0, vocab=48):
    g = torch.Generator().manual_seed(seed)
    prompts = [Prompt(tuple(torch.randint(0, vocab, (length,), generator=g).tolist()), f"d{i}",
                      tenant=None if tenants is None else tenants[i]) for i in range(n_prompts)]
    return Stream("unit", "test", prompts, max_new)


def drift(draft, cfg=CFG, **kw):
    return DriftMethod(draft, cfg, books_factory=make_books, backend="reference", key_map=FAST_KEY_MAP, **kw)


class Recording(DriftMethod):
    """Records every proposal's tokens per prompt, to compare what two runs proposed."""

    def begin_stream(self):
        super().begin_stream()
        self.proposals = []

    def begin_prompt(self, prompt, tenant=None):
        super().begin_prompt(prompt, tenant)
        self.proposals.append([])

    def propose(self, context, gamma, sampler):
        prop = super().propose(context, gamma, sampler)
        self.proposals[-1].append(prop.tokens.tolist())
        return prop


def recording(draft, cfg=CFG, **kw):
    return Recording(draft, cfg, books_factory=make_books, backend="reference", key_map=FAST_KEY_MAP, **kw)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_drift_equals_ar_and_the_bias_acts(gamma, key):
    draft, target = tiny_pair(scale=4.0)
    s = stream()
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=24)
    lm = CausalLM(target, "target")
    ar = run_stream(lm, Autoregressive(), s, cfg)
    method = recording(draft, replace(CFG, key=key))
    dr = run_stream(lm, method, s, cfg)
    assert [g.output_ids for g in dr.generations] == [g.output_ids for g in ar.generations]
    assert dr.report["prototypes"] > 0 and dr.report["updates"] > 0
    plain = recording(draft, DriftConfig(gain=0.0, tau=0.3, sigma=1.0, bank_size=64, support=8, key=key))
    run_stream(lm, plain, s, cfg)
    assert method.proposals != plain.proposals          # the bias changed what the draft proposed
    if key == "target-est":                             # keyed in the target's hidden size, refitted
        assert method.banks["default"].dim == target.config.hidden_size
        assert dr.report["key_map"]["tenants"]["default"]["fits"] >= 2


@pytest.mark.parametrize("key", KEYS)
def test_no_gradient_and_no_new_parameter(key):
    draft, target = tiny_pair(scale=4.0)
    before = [(n, p.shape, p.requires_grad) for n, p in draft.named_parameters()]
    weights = [p.detach().clone() for p in draft.parameters()]
    method = drift(draft, replace(CFG, key=key))
    run_stream(CausalLM(target, "target"), method, stream(n_prompts=2), DecodeConfig(gamma=4, max_new_tokens=16))
    assert [(n, p.shape, p.requires_grad) for n, p in draft.named_parameters()] == before
    assert all(p.grad is None for p in draft.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, draft.parameters(), strict=True))
    assert list(method.__dict__.get("_parameters", {})) == []
    bank = method.banks["default"]
    state = [bank.keys, bank.bias, bank.support, bank.counts]
    if key == "target-est":
        keymap = method.keymaps["default"]
        state += [keymap.xtx, keymap.xty, keymap.weight, keymap.intercept, method.shadows["default"].states]
    for t in state:
        assert not t.requires_grad and t.grad_fn is None


@pytest.mark.parametrize("key", KEYS)
def test_tenant_isolation(key):
    draft, target = tiny_pair(scale=4.0)
    cfg = DecodeConfig(gamma=4, max_new_tokens=20)
    lm = CausalLM(target, "target")
    mixed = stream(n_prompts=6, tenants=["a", "b", "a", "b", "a", "b"], seed=1)
    only_b = Stream("unit", "test", [p for p in mixed.prompts if p.tenant == "b"], mixed.max_new_tokens)
    dcfg = replace(CFG, key=key)
    both, alone = recording(draft, dcfg), recording(draft, dcfg)
    run_stream(lm, both, mixed, cfg)
    run_stream(lm, alone, only_b, cfg)
    b_props = [props for props, p in zip(both.proposals, mixed.prompts, strict=True) if p.tenant == "b"]
    assert b_props == alone.proposals
    assert both.banks["a"].n_valid > 0 and both.banks["b"].n_valid == alone.banks["b"].n_valid
    # and tenant a did learn something that would have changed b's proposals had it been shared
    shared = recording(draft, dcfg)
    run_stream(lm, shared, Stream("unit", "test", [p.__class__(p.ids, p.doc_id) for p in mixed.prompts], 20), cfg)
    assert [props for props, p in zip(shared.proposals, mixed.prompts, strict=True) if p.tenant == "b"] != alone.proposals


@pytest.mark.skipif(RustBooks is None, reason="drift_cli._bank (the Rust books) is not built")
def test_snapshot_reproduces_proposals(tmp_path):
    draft, target = tiny_pair(scale=4.0)
    cfg = DecodeConfig(gamma=4, max_new_tokens=20)
    lm = CausalLM(target, "target")
    path = tmp_path / "bank.safetensors"
    first = DriftMethod(draft, CFG, fingerprint="fp-1", bank_out=path, backend="reference")
    run_stream(lm, first, stream(n_prompts=3, seed=2), cfg)
    probe = stream(n_prompts=2, seed=9)
    warm = Recording(draft, CFG, fingerprint="fp-1", bank_in=path, backend="reference")
    cold = Recording(draft, CFG, fingerprint="fp-1", backend="reference")
    cont = Recording(draft, CFG, fingerprint="fp-1", backend="reference")
    # `cont` continues the first run's bank in memory: the snapshot must behave identically
    cont.begin_stream = lambda: (setattr(cont, "proposals", []), setattr(cont, "banks", first.banks))  # type: ignore[method-assign]
    run_stream(lm, warm, probe, cfg)
    run_stream(lm, cont, probe, cfg)
    run_stream(lm, cold, probe, cfg)
    assert warm.proposals == cont.proposals
    assert warm.proposals != cold.proposals


@pytest.mark.stats
def test_sampling_with_a_nonzero_bias_is_exact():
    from tests.exactness import SIGNIFICANCE, sampling_p_value

    draft, target = tiny_pair(vocab=8, seed=3, scale=1.0)
    cfg = DriftConfig(gain=3.0, tau=0.0, sigma=1.0, bank_size=16, support=4)

    moved = []

    def make():
        m = drift(draft, cfg)
        adjust = m.adjust

        def spy(h, z, sampler):  # record whether the bias really moved the proposal
            out = adjust(h, z, sampler)
            moved.append(not torch.equal(out, z))
            return out
        m.adjust = spy
        return m

    p = sampling_p_value(target, make, [1, 2, 3], n_tokens=2, samples=1500, temperature=1.0, gamma=2)
    assert sum(moved) > len(moved) // 2        # most proposals were drawn from a biased q'
    assert p > SIGNIFICANCE


def test_triton_backend_reproduces_the_reference_run():
    """The whole method with the Triton kernels (interpreter on the CPU) proposes what the reference does."""
    pytest.importorskip("triton")
    draft, target = tiny_pair(scale=4.0)
    s, cfg = stream(n_prompts=1, max_new=16), DecodeConfig(gamma=4, max_new_tokens=16)
    lm = CausalLM(target, "target")
    runs = {}
    for backend in ("reference", "triton"):
        m = Recording(draft, CFG, books_factory=make_books, backend=backend)
        run_stream(lm, m, s, cfg)
        runs[backend] = m
    ref, tri = runs["reference"], runs["triton"]
    assert tri.proposals == ref.proposals
    a, b = ref.banks["default"], tri.banks["default"]
    assert torch.equal(a.support, b.support) and torch.equal(a.counts, b.counts)
    torch.testing.assert_close(b.keys, a.keys, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.bias, a.bias, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key,temperature", [("draft", 0.0), ("draft", 0.8), ("target-est", 0.0)])
def test_cpu_path_reproduces_the_reference_run(key, temperature):
    """The Rust CPU path (the default on the CPU) proposes exactly what the PyTorch reference does,
    greedy and sampled (the update divides the logits by T itself; target-est: with re-keying
    written through the tensors the CPU path shares)."""
    draft, target = tiny_pair(scale=4.0)
    s, cfg = stream(n_prompts=3, max_new=20), DecodeConfig(gamma=4, max_new_tokens=20, temperature=temperature)
    lm = CausalLM(target, "target")
    runs = {}
    for backend in ("reference", "cpu"):
        m = Recording(draft, replace(CFG, key=key), books_factory=make_books, backend=backend, key_map=FAST_KEY_MAP)
        run_stream(lm, m, s, cfg)
        runs[backend] = m
    ref, fast = runs["reference"], runs["cpu"]
    assert fast.banks["default"].native and ref.banks["default"].cpu is None
    assert fast.proposals == ref.proposals
    a, b = ref.banks["default"], fast.banks["default"]
    assert torch.equal(a.support, b.support) and torch.equal(a.counts, b.counts) and a.n_valid == b.n_valid > 0
    torch.testing.assert_close(b.keys, a.keys, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.bias, a.bias, atol=1e-4, rtol=0)


def test_warm_up_compiles_the_banks_kernels_at_the_runs_shapes_on_cuda_only(monkeypatch):
    import drift_kernels

    seen = []
    monkeypatch.setattr(drift_kernels, "warm_up", lambda *a, **kw: seen.append((a, kw)) or 1)
    draft, _ = tiny_pair()
    method = DriftMethod(draft, CFG)           # backend auto
    method.warm_up(3, 4)                       # the CPU: nothing to compile
    assert seen == []
    method.device = torch.device("cuda")       # where the Triton path runs
    method.warm_up(3, 4)
    (args, kw), = seen
    assert args[1:4] == (method.dim, CFG.support, CFG.neighbors)
    assert kw["queries"] == 3 and kw["positions"] == 12 and kw["bank_size"] == CFG.bank_size
    seen.clear()
    reference = drift(draft)                   # the reference backend launches no kernel
    reference.device = torch.device("cuda")
    reference.warm_up(3, 4)
    assert seen == []
