"""The CPU skinny GEMM (`drift_cli.engine.cpu_linear`, `drift_bank_core::skinny`): agreement with
F.linear, a row's outputs independent of the other rows scored with it, the switch to F.linear
and for training (the whole forward's logits of a position alone vs among k tokens:
tests/test_lean.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drift_cli.engine import cpu_linear
from drift_cli.engine.lm import CausalLM
from tests.models import tiny_llama

pytestmark = pytest.mark.skipif(cpu_linear._SKINNY is None, reason="the extension has no skinny_linear")


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 33, 7), (3, 50, 64), (4, 4096, 96), (16, 257, 576), (32, 9, 33)])
@pytest.mark.parametrize("threads", [1, 2])
def test_agrees_with_f_linear(m, n, k, threads):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for bias in (None, b):
            got, want = cpu_linear.skinny(x, w, bias), F.linear(x, w, bias)
            assert got.shape == want.shape == (m, n)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k ** 0.5)
    finally:
        torch.set_num_threads(before)


def test_a_row_is_bitwise_the_same_alone_or_among_others():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(16, 200, generator=g), torch.randn(1031, 200, generator=g), torch.randn(1031, generator=g)
    all_rows = cpu_linear.skinny(x, w, b)
    for m in (1, 2, 3, 4, 7, 8, 13):
        assert torch.equal(cpu_linear.skinny(x[:m], w, b), all_rows[:m]), m
    assert torch.equal(cpu_linear.skinny(x[9:10], w, b)[0], all_rows[9])
    # a [B, S, K] input is the same rows
    assert torch.equal(cpu_linear.skinny(x.view(4, 4, 200), w, b).view(16, -1), all_rows)


def test_bad_operands_are_refused():
    w = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="disagree"):
        cpu_linear._SKINNY(torch.zeros(2, 7), w, None, torch.empty(2, 4), 1)
    with pytest.raises(ValueError, match="float32"):
        cpu_linear._SKINNY(torch.zeros(2, 8, dtype=torch.float64), w, None, torch.empty(2, 4), 1)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_linear._SKINNY(torch.zeros(8, 2).T, w, None, torch.empty(2, 4), 1)
    with pytest.raises(ValueError, match="overlaps"):
        x = torch.zeros(2, 8)
        cpu_linear._SKINNY(x, w, None, x.view(-1)[:8].view(2, 4), 1)


def test_install_keeps_the_module_and_training_keeps_autograd():
    model = tiny_llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    count = cpu_linear.install(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert count == len(linears) > 0 and all(type(m) is cpu_linear.SkinnyLinear for m in linears)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    lin = linears[0]
    x = torch.randn(2, lin.in_features)
    before = torch.get_num_threads()
    torch.set_num_threads(1)                   # the path serves one thread (MAX_THREADS)
    try:
        with torch.inference_mode():
            assert torch.equal(lin(x), cpu_linear.skinny(x, lin.weight, lin.bias))
    finally:
        torch.set_num_threads(before)
    lin.weight.requires_grad_(True)            # training: F.linear with autograd
    y = lin(x)
    assert y.grad_fn is not None
    y.sum().backward()
    assert lin.weight.grad is not None
    lin.weight.requires_grad_(False)           # a frozen layer above a trainable one: the
    h = x.clone().requires_grad_(True)         # gradient still flows through it to its input
    lin(h).sum().backward()
    assert h.grad is not None and torch.allclose(h.grad, lin.weight.sum(0).expand_as(h))
    big = torch.randn(cpu_linear.MAX_ROWS + 1, lin.in_features)    # a long prefill: F.linear
    assert not cpu_linear.eligible(big, lin.weight.detach())
    cpu_linear.uninstall(model)
    assert all(type(m) is torch.nn.Linear for m in linears)


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV, "0")
    model = tiny_llama()
    assert cpu_linear.install(model) == 0
    assert not any(type(m) is cpu_linear.SkinnyLinear for m in model.modules())
    monkeypatch.setenv(cpu_linear.ENV, "1")
    assert CausalLM(model).model is model and any(type(m) is cpu_linear.SkinnyLinear for m in model.modules())


def test_more_threads_than_the_path_serves_take_f_linear():
    w, x = torch.randn(8, 16), torch.randn(2, 16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cpu_linear.eligible(x, w)
        torch.set_num_threads(cpu_linear.MAX_THREADS + 1)
        assert not cpu_linear.eligible(x, w)
    finally:
        torch.set_num_threads(before)
