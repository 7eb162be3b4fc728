"""The lean CPU forward (`drift_cli.engine.lean`, `drift_bank_core::layer`): the same hidden
states and logits as transformers' Llama forward on every path the engine takes (batch 1 with
its in-place cache, rows with a 4D mask, trees, rollback, captured features), its kernels
against PyTorch references, where it applies, and a wrong kernel caught."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drift_cli.engine import lean
from drift_cli.engine.lm import CausalLM
from tests.models import tiny_llama

pytestmark = pytest.mark.skipif(lean._FUSED is None, reason="the extension has no fused layer kernels")


def _pair(monkeypatch, model):
    """(lean LM, transformers LM) over the same model."""
    fast = CausalLM(model)
    monkeypatch.setenv(lean.ENV, "0")
    stock = CausalLM(model)
    monkeypatch.delenv(lean.ENV)
    assert fast.lean is not None and stock.lean is None
    return fast, stock


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("hidden,layers", [(32, 2), (64, 3)])
def test_batch_one_matches_transformers_through_steps_and_rollback(monkeypatch, hidden, layers):
    model = tiny_llama(hidden=hidden, layers=layers, seed=hidden)
    fast, stock = _pair(monkeypatch, model)
    ids = torch.randint(0, 48, (1, 40), generator=torch.Generator().manual_seed(5))
    for lm in (fast, stock):
        lm.reset()
    for a, b in (((0, 9), (0, 9)), ((9, 10), (9, 10)), ((10, 14), (10, 14)), ((14, 15), (14, 15))):
        (ha, la), (hb, lb) = fast.forward(ids[:, a[0]:a[1]]), stock.forward(ids[:, b[0]:b[1]])
        _close(ha, hb)
        _close(la, lb)
    for lm in (fast, stock):
        lm.crop(11)                                    # a rejection: roll back, then score 5
    _close(fast.forward(ids[:, 11:16])[1], stock.forward(ids[:, 11:16])[1])
    # past the in-place cache's first capacity (64): it grows and keeps what it held
    _close(fast.forward(ids[:, 16:40].repeat(1, 3))[1], stock.forward(ids[:, 16:40].repeat(1, 3))[1])
    assert fast.cache_len == stock.cache_len == 88


def test_rows_and_a_tree_mask_match_transformers(monkeypatch):
    from drift_cli.engine.tree import Attention

    model = tiny_llama(seed=7)
    fast, stock = _pair(monkeypatch, model)
    g = torch.Generator().manual_seed(2)
    feeds = [torch.randint(0, 48, (n,), generator=g) for n in (6, 3, 9)]
    for lm in (fast, stock):
        lm.reset_rows(3, row_cache=True)
    _close(fast.forward_rows([0, 1, 2], feeds)[1], stock.forward_rows([0, 1, 2], feeds)[1])
    step = [torch.randint(0, 48, (n,), generator=g) for n in (2, 1)]
    _close(fast.forward_rows([2, 0], step)[1], stock.forward_rows([2, 0], step)[1])
    # a tree over row 1: node 0 the root, 1 and 2 its children, 3 a child of 2
    lengths = [fast.row_len(1)]
    pos = torch.tensor([[lengths[0] + d for d in (0, 1, 1, 2)]])
    seen = torch.arange(lengths[0] + 4)[None, None] < lengths[0]
    parents = [-1, 0, 0, 2]
    anc = torch.zeros(4, 4, dtype=torch.bool)
    for i, p in enumerate(parents):
        anc[i, i] = True
        while p >= 0:
            anc[i, p] = True
            p = parents[p]
    visible = seen.repeat(1, 4, 1)
    visible[0, :, lengths[0]:] = anc
    tree = Attention(positions=pos, visible=visible)
    nodes = [torch.randint(0, 48, (4,), generator=g)]
    _close(fast.forward_rows([1], nodes, attend=tree)[1], stock.forward_rows([1], nodes, attend=tree)[1])


def test_captured_features_match_and_survive_the_in_place_residual(monkeypatch):
    model = tiny_llama(layers=3, seed=11)
    fast, stock = _pair(monkeypatch, model)
    for lm in (fast, stock):
        lm.capture((0, 2, 3))
        lm.reset()
    ids = torch.randint(0, 48, (1, 8), generator=torch.Generator().manual_seed(3))
    for sl in (slice(0, 6), slice(6, 7), slice(7, 8)):
        fast.forward(ids[:, sl])
        stock.forward(ids[:, sl])
        _close(fast.features, stock.features)


def test_the_lean_path_is_chosen_only_where_it_computes_the_same(monkeypatch):
    model = tiny_llama()
    assert lean.supports(model.get_decoder())
    model.config.attention_bias = True                  # a config the fused layer does not compute
    assert lean.make(model.get_decoder()) is None
    model.config.attention_bias = False
    assert lean.make(model.get_decoder()) is not None
    assert lean.make(tiny_llama().to(torch.bfloat16).get_decoder()) is None
    monkeypatch.setenv("DRIFT_CPU_LINEAR", "0")         # the stock path's switch turns this off too
    assert lean.make(model.get_decoder()) is None


def test_the_attention_kernel_matches_sdpa_with_grouped_heads_and_strided_caches():
    g = torch.Generator().manual_seed(9)
    r, s, hq, hkv, d, length = 2, 1, 6, 2, 16, 37
    q = torch.randn(r, s, hq + hkv, d, generator=g)[:, :, :hq]            # a view, as the layer passes it
    buf = torch.randn(r, hkv, 64, d, generator=g)
    keys, values = buf[:, :, :length], torch.randn(r, hkv, 64, d, generator=g)[:, :, :length]
    mask = torch.zeros(r, 1, s, length).masked_fill_(torch.rand(r, 1, s, length, generator=g) < 0.3, -3.0e38)
    mask[..., 0] = 0.0
    out = torch.empty(r, s, hq * d)
    lean._FUSED[2](q, keys, values, mask, 0.25, out)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, scale=0.25,
                                          enable_gqa=True).transpose(1, 2).reshape(r, s, hq * d)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    # the query heads read their own KV group: swapping the groups' keys changes the result
    lean._FUSED[2](q, keys.flip(1), values, mask, 0.25, out)
    assert not torch.allclose(out, want, atol=1e-3)


def test_the_fused_linear_and_mlp_match_pytorch():
    g = torch.Generator().manual_seed(4)
    m, d, f = 3, 40, 72
    h, nw = torch.randn(m, d, generator=g), torch.rand(d, generator=g) + 0.5
    wq, wk = torch.randn(24, d, generator=g), torch.randn(8, d, generator=g)
    x = F.rms_norm(h, (d,), nw, 1e-5)
    out = torch.empty(m, 32)
    lean._FUSED[0](h, nw, 1e-5, [wq, wk], out, False, 1)
    torch.testing.assert_close(out, torch.cat([x @ wq.T, x @ wk.T], -1), rtol=1e-5, atol=1e-5)
    acc = h.clone()
    lean._FUSED[0](out[:, :24].contiguous(), None, 0.0, [torch.randn(d, 24, generator=g)], acc, True, 1)
    assert not torch.equal(acc, h)
    wg, wu, wd = torch.randn(f, d, generator=g), torch.randn(f, d, generator=g), torch.randn(d, f, generator=g)
    want = h + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
    got = h.clone()
    lean._FUSED[1](got, nw, 1e-5, wg, wu, wd, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    norm = torch.empty_like(h)
    lean._FUSED[3](h, nw, 1e-5, norm)
    torch.testing.assert_close(norm, x, rtol=1e-6, atol=1e-6)


def test_the_kernels_refuse_shapes_that_disagree_and_outputs_that_alias():
    h = torch.randn(2, 8)
    with pytest.raises(ValueError):
        lean._FUSED[0](h, torch.ones(7), 1e-6, [torch.randn(4, 8)], torch.empty(2, 4), False, 1)
    with pytest.raises(ValueError):
        lean._FUSED[0](h, None, 0.0, [torch.randn(4, 8)], h, True, 1)           # out is x
    with pytest.raises(ValueError):
        lean._FUSED[1](h, torch.ones(8), 1e-6, torch.randn(6, 8), torch.randn(5, 8), torch.randn(8, 6), 1)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError):
        lean._FUSED[2](q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), None, 1.0, torch.empty(1, 1, 32))


def test_a_position_scored_alone_or_among_others_gives_the_same_bits():
    """Batch 1's one-call step computes every position by the same operations whatever the
    others (row-independent linear layers, attention whose masked keys add exact zeros): a
    position's hidden state and logits are bitwise the same scored alone or among 8."""
    model = tiny_llama(hidden=64, seed=13)
    lm = CausalLM(model)
    ids = torch.randint(0, 48, (1, 20), generator=torch.Generator().manual_seed(1))
    lm.reset()
    lm.forward(ids[:, :12])
    alone = [lm.forward(ids[:, i:i + 1]) for i in range(12, 20)]
    lm.crop(12)
    hidden, logits = lm.forward(ids[:, 12:20])
    assert torch.equal(torch.cat([h for h, _ in alone], dim=1), hidden)
    assert torch.equal(torch.cat([lg for _, lg in alone], dim=1), logits)


def test_weights_updated_in_place_or_replaced_are_read_by_the_next_step(monkeypatch):
    """The one-call step reads the weights at every call (OSD trains a draft in place) and
    notices a weight that moved (`param.data = ...`): it rebuilds its plan, never reads freed memory."""
    model = tiny_llama(layers=2, seed=19)
    fast, stock = _pair(monkeypatch, model)
    ids = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(4))
    for lm in (fast, stock):
        lm.reset()
        lm.forward(ids[:, :8])
    plan = fast.lean._plan
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1.5)                       # in place
    _close(fast.forward(ids[:, 8:9])[1], stock.forward(ids[:, 8:9])[1])
    assert fast.lean._plan is plan
    proj = model.model.layers[0].self_attn.q_proj
    proj.weight.data = proj.weight.data * 0.5                                       # moved
    _close(fast.forward(ids[:, 9:12])[1], stock.forward(ids[:, 9:12])[1])
    assert fast.lean._plan is not plan


def test_two_threads_take_the_kernels_and_give_one_threads_bits(monkeypatch):
    """Up to `MAX_THREADS` the one-call step serves batch 1 (the pool shares the weight rows) and
    its numerics do not depend on the thread count: the same logits, bit for bit."""
    from drift_cli.engine import cpu_linear

    assert cpu_linear.MAX_THREADS >= 2
    calls = []
    real = lean._PLAN

    class Counted:
        def __init__(self, *args):
            self.plan = real(*args)

        def step(self, *args):
            calls.append(args)
            return self.plan.step(*args)

    monkeypatch.setattr(lean, "_PLAN", Counted)
    model = tiny_llama(hidden=64, layers=2, seed=17)
    lm = CausalLM(model)
    ids = torch.randint(0, 48, (1, 16), generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            lm.reset()
            lm.forward(ids[:, :10])
            calls.clear()
            out[threads] = torch.cat([lm.forward(ids[:, 10:11])[1], lm.forward(ids[:, 11:15])[1]], dim=1)
            assert calls, f"{threads} threads: the one-call step was not used"
            assert torch.get_num_threads() == threads       # restored after the kernels' block
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[1], out[2])
