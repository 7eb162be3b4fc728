"""Triton kernels vs the PyTorch reference, under TRITON_INTERPRET=1 on the CPU (conftest sets it).

Shapes are odd on purpose (N not a multiple of the tile, d not a power of two, k above the
number of valid slots, empty banks). One tolerance table per key dtype; the fp32 bias add is
compared bit for bit, and so is the fused draft step's bias add of its own neighbours.
"""

import os

import numpy as np
import pytest
import torch

import drift_kernels
from drift_kernels import reference

triton = pytest.importorskip("triton")

# The Triton kernels run on CUDA tensors on a GPU (run these tests there with TRITON_INTERPRET=0)
# and on CPU tensors in the interpreter; inputs move to that device and results come back.
KERNEL_DEVICE = torch.device("cuda") if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" \
    else torch.device("cpu")


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, reference.Neighbours):
        return reference.Neighbours(x.idx.to(dev), x.sim.to(dev), x.weight.to(dev))
    if isinstance(x, tuple):
        return tuple(_to(y, dev) for y in x)
    return x


def run_op(op, *args, backend, **kw):
    """drift_kernels.<op>(*args, backend=...) with the triton backend on KERNEL_DEVICE."""
    fn = getattr(drift_kernels, op)
    if backend != "triton" or KERNEL_DEVICE.type == "cpu":
        return fn(*args, backend=backend, **kw)
    moved = [_to(a, KERNEL_DEVICE) for a in args]
    out = fn(*moved, backend=backend, **kw)
    if op == "update":                       # in place: copy keys, bias, counts back
        for dst, src in zip(args[:3], moved[:3]):
            dst.copy_(src.cpu())
    return _to(out, torch.device("cpu"))


# dtype -> (similarity / weight atol, stored-key atol after an update)
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-5, 1e-3),
    torch.bfloat16: (1e-5, 8e-3),
}


def make_bank(n, d, dtype, seed=0, valid_share=1.0):
    g = torch.Generator().manual_seed(seed)
    keys = reference.unit_rows(torch.randn(n, d, generator=g)).to(dtype)
    valid = torch.rand(n, generator=g) < valid_share
    return keys, valid, g


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("n,d,q,k", [(6, 20, 3, 4), (123, 48, 5, 4), (4097, 24, 2, 3), (9, 17, 4, 8)])
def test_retrieval_matches_reference(dtype, n, d, q, k):
    keys, valid, g = make_bank(n, d, dtype, seed=n, valid_share=0.7)
    h = torch.randn(q, d, generator=g) * 3.0
    got = run_op("retrieve", h, keys, valid, k, sigma=0.5, backend="triton")
    want = reference.retrieve(h, keys, valid, k, sigma=0.5)
    assert torch.equal(got.idx, want.idx)
    assert torch.equal(torch.isinf(got.sim), torch.isinf(want.sim))
    live = want.idx >= 0
    atol = TOL[dtype][0]
    torch.testing.assert_close(got.sim[live], want.sim[live], atol=atol, rtol=0)
    torch.testing.assert_close(got.weight, want.weight, atol=atol, rtol=0)
    assert bool((got.weight[~live] == 0).all())


def test_retrieval_k_above_valid_count_pads_with_minus_one():
    keys, _, g = make_bank(10, 16, torch.float32)
    valid = torch.zeros(10, dtype=torch.bool)
    valid[[2, 7]] = True
    h = torch.randn(2, 16, generator=g)
    for backend in ("triton", "reference"):
        nb = run_op("retrieve", h, keys, valid, 4, sigma=0.5, backend=backend)
        assert sorted(nb.idx[0, :2].tolist()) == [2, 7]
        assert nb.idx[:, 2:].tolist() == [[-1, -1], [-1, -1]]
        assert nb.weight[:, 2:].abs().sum().item() == 0.0


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_retrieval_empty_bank(backend):
    h = torch.randn(3, 16)
    for keys, valid in [(torch.empty(0, 16), torch.empty(0, dtype=torch.bool)),
                        (torch.randn(5, 16), torch.zeros(5, dtype=torch.bool))]:
        nb = run_op("retrieve", h, keys, valid, 4, sigma=0.5, backend=backend)
        assert nb.idx.tolist() == [[-1] * 4] * 3
        assert nb.weight.abs().sum().item() == 0.0


def test_retrieval_ties_go_to_the_lower_slot():
    # 70 identical one-hot keys across two tiles: every similarity is exactly 1 in any summation
    # order (a random key would tie only up to the BLAS's rounding, which differs by lane)
    key = torch.zeros(1, 16)
    key[0, 3] = 1.0
    keys = key.repeat(70, 1)
    valid = torch.ones(70, dtype=torch.bool)
    for backend in ("triton", "reference", "cpu"):
        nb = run_op("retrieve", key * 2, keys, valid, 4, sigma=0.5, backend=backend)
        assert nb.idx.tolist() == [[0, 1, 2, 3]]


def test_retrieval_exact_key_has_weight_one():
    keys, valid, _ = make_bank(30, 24, torch.float32)
    nb = run_op("retrieve", keys[[11]] * 5.0, keys, valid, 2, sigma=0.3, backend="triton")
    assert nb.idx[0, 0].item() == 11
    assert abs(nb.weight[0, 0].item() - 1.0) < 1e-6


def make_bias_case(q, n, m, v, k, seed):
    g = torch.Generator().manual_seed(seed)
    # token 3 in every prototype (so the scatter sums collide), the other ids unique per row
    rest = torch.stack([torch.randperm(v - 1, generator=g)[:m - 1] for _ in range(n)])
    support = torch.cat([torch.full((n, 1), 3), rest + (rest >= 3).long()], dim=1).to(torch.int32)
    assert all(len(set(row)) == m for row in support.tolist())
    bias = torch.randn(n, m, generator=g) * 2.0
    keys = reference.unit_rows(torch.randn(n, 24, generator=g))
    valid = torch.rand(n, generator=g) < 0.8
    nb = reference.retrieve(torch.randn(q, 24, generator=g), keys, valid, k, sigma=0.4)
    z = torch.randn(q, v, generator=g) * 4.0
    return z, nb, support, bias


@pytest.mark.parametrize("q,n,m,v,k", [(1, 6, 5, 50, 4), (4, 123, 32, 1000, 4), (3, 7, 9, 97, 8), (5, 40, 1, 13, 3)])
def test_sparse_bias_add_is_bit_exact(q, n, m, v, k):
    z, nb, support, bias = make_bias_case(q, n, m, v, k, seed=q * 1000 + n)
    before = z.clone()
    got = run_op("bias_add", z, nb, support, bias, gain=0.6, backend="triton")
    want = reference.bias_add(z, nb, support, bias, gain=0.6)
    assert torch.equal(got, want)
    assert torch.equal(z, before)                 # the input logits are not modified
    assert not torch.equal(got, z)                # and the bias did something


def test_bias_add_scatter_forms_agree_bitwise():
    z, nb, support, bias = make_bias_case(4, 50, 16, 300, 4, seed=7)
    flat = reference.bias_add(z, nb, support, bias, 0.6, per_neighbour=False)
    assert torch.equal(flat, reference.bias_add(z, nb, support, bias, 0.6, per_neighbour=True))


def test_bias_add_by_hand():
    z = torch.zeros(1, 6)
    nb = reference.Neighbours(torch.tensor([[0, 1]]), torch.tensor([[1.0, 0.9]]), torch.tensor([[1.0, 0.5]]))
    support = torch.tensor([[1, 2], [2, 4]])
    bias = torch.tensor([[1.0, 2.0], [4.0, -8.0]])
    # β = (1·[0,1,2,0,0,0] + 0.5·[0,0,4,0,-8,0]) / max(1, 1.5) ; λ = 0.75
    want = torch.tensor([[0.0, 0.5, 2.0, 0.0, -2.0, 0.0]])
    for backend in ("triton", "reference"):
        assert torch.equal(run_op("bias_add", z, nb, support, bias, 0.75, backend=backend), want)


@pytest.mark.parametrize("q,n,v,k", [(2, 6, 37, 4), (3, 20, 1500, 3)])
def test_dense_bias_add_is_bit_exact(q, n, v, k):
    g = torch.Generator().manual_seed(v)
    bias = torch.randn(n, v, generator=g)
    keys = reference.unit_rows(torch.randn(n, 16, generator=g))
    nb = reference.retrieve(torch.randn(q, 16, generator=g), keys, torch.ones(n, dtype=torch.bool), k, 0.4)
    z = torch.randn(q, v, generator=g)
    got = run_op("bias_add", z, nb, None, bias, gain=0.6, backend="triton")
    assert torch.equal(got, reference.bias_add_dense(z, nb, bias, gain=0.6))


def test_bias_add_with_no_neighbours_is_identity():
    z = torch.randn(2, 30)
    nb = reference.retrieve(torch.randn(2, 8), torch.empty(0, 8), torch.empty(0, dtype=torch.bool), 4, 0.5)
    support = torch.zeros(0, 4, dtype=torch.int64)
    for backend in ("triton", "reference"):
        assert torch.equal(run_op("bias_add", z, nb, support, torch.zeros(0, 4), 0.6, backend=backend), z)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("n,d,m,slots", [(6, 20, 5, [2, 4, 2, 0]), (123, 33, 32, [100, 7, 100, 100, 5])])
def test_update_matches_reference(dtype, adaptive, n, d, m, slots):
    keys, _, g = make_bank(n, d, dtype, seed=d)
    bias = torch.randn(n, m, generator=g)
    counts = torch.randint(0, 5, (n,), generator=g, dtype=torch.int32)
    slots = torch.tensor(slots)
    residual = torch.randn(len(slots), m, generator=g)
    h = torch.randn(len(slots), d, generator=g) * 2
    state = [keys.clone(), bias.clone(), counts.clone()]
    run_op("update", *state, slots, residual, h, eta=0.1, adaptive=adaptive, backend="triton")
    want = [keys.clone(), bias.clone(), counts.clone()]
    reference.update(*want, slots, residual, h, eta=0.1, adaptive=adaptive)
    torch.testing.assert_close(state[0].float(), want[0].float(), atol=TOL[dtype][1], rtol=0)
    torch.testing.assert_close(state[1], want[1], atol=1e-6, rtol=1e-6)
    assert torch.equal(state[2], want[2])
    norms = state[0].float().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(n), atol=TOL[dtype][1] * 10, rtol=0)


def test_update_by_hand():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    bias = torch.tensor([[1.0, -1.0], [0.0, 0.0]])
    counts = torch.tensor([1, 0])
    residual = torch.tensor([[3.0, 1.0], [5.0, 5.0]])
    h = torch.tensor([[0.0, 2.0], [0.0, 7.0]])
    # position 0 hits slot 0 with n=1: η = max(0.1, 1/2) = 0.5; position 1 hits slot 0 again, n=2: η = 1/3
    for backend in ("triton", "reference"):
        k, b, c = keys.clone(), bias.clone(), counts.clone()
        run_op("update", k, b, c, torch.tensor([0, 0]), residual, h, eta=0.1, adaptive=True, backend=backend)
        b0 = 0.5 * torch.tensor([1.0, -1.0]) + 0.5 * residual[0]                    # [2, 0]
        b1 = (2 / 3) * b0 + (1 / 3) * residual[1]                                  # [3, 5/3]
        k0 = torch.tensor([0.5, 0.5]) / torch.tensor([0.5, 0.5]).norm()
        k1 = (2 / 3) * k0 + (1 / 3) * torch.tensor([0.0, 1.0])
        k1 = k1 / k1.norm()
        torch.testing.assert_close(b[0], b1, atol=1e-6, rtol=0)
        torch.testing.assert_close(k[0], k1, atol=1e-6, rtol=0)
        assert c.tolist() == [3, 0]
        assert torch.equal(k[1], keys[1]) and torch.equal(b[1], bias[1])


def test_support_residual_renormalises_and_clips():
    logp = torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0, -30.0]]), -1)
    logq = torch.log_softmax(torch.tensor([[5.0, 1.0, 1.0, 1.0]]), -1)
    r = reference.support_residual(logp, logq, torch.tensor([[1, 2]]))
    # p over {1,2} = softmax([1,2]); q over {1,2} = [0.5, 0.5]
    want = torch.log_softmax(torch.tensor([1.0, 2.0]), -1) - torch.log(torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(r[0], want)
    r = reference.support_residual(logp, logq, torch.tensor([[3, 0]]))
    assert r[0, 0].item() == -10.0


def test_auto_backend_picks_rust_for_cpu_tensors_and_the_reference_elsewhere():
    assert not drift_kernels.use_triton(torch.zeros(1), "auto")
    assert drift_kernels.ops.resolve(torch.zeros(1), "auto") == "cpu"                   # the Rust path
    assert drift_kernels.ops.resolve(torch.zeros(1, device="meta"), "auto") == "reference"
    assert drift_kernels.ops.resolve(torch.zeros(1), "reference") == "reference"
    assert drift_kernels.use_triton(torch.zeros(1), "triton")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        drift_kernels.use_triton(torch.zeros(1), "cuda")


# --- the numpy CPU fast path against the reference ---------------------------------------------

@pytest.mark.parametrize("n,d,q,k,share", [(6, 20, 3, 4, 0.7), (123, 48, 5, 4, 0.7), (300, 96, 1, 4, 1.0), (9, 17, 4, 8, 0.5)])
def test_cpu_retrieval_matches_reference(n, d, q, k, share):
    keys, valid, g = make_bank(n, d, torch.float32, seed=n + 1, valid_share=share)
    h = torch.randn(q, d, generator=g)
    got = run_op("retrieve", h, keys, valid, k, sigma=0.3, backend="cpu")
    want = reference.retrieve(h, keys, valid, k, sigma=0.3)
    assert torch.equal(got.idx, want.idx)
    live = want.idx >= 0
    torch.testing.assert_close(got.sim[live], want.sim[live], atol=1e-6, rtol=0)
    torch.testing.assert_close(got.weight, want.weight, atol=1e-6, rtol=0)


def test_cpu_retrieval_ties_and_empty():
    # identical keys give identical similarities: ties go to the lower slot, at the top-k boundary too
    a, b, c = (reference.unit_rows(torch.randn(1, 16, generator=torch.Generator().manual_seed(s))) for s in (1, 2, 3))
    keys = torch.cat([a, b, a, b, c, a])
    nb = run_op("retrieve", b, keys, torch.ones(6, dtype=torch.bool), 3, 0.5, backend="cpu")
    assert nb.idx[0, :2].tolist() == [1, 3]
    assert nb.idx.tolist() == reference.retrieve(b, keys, torch.ones(6, dtype=torch.bool), 3, 0.5).idx.tolist()
    nb = run_op("retrieve", a, keys, torch.tensor([True, True, False, True, True, True]), 2, 0.5, backend="cpu")
    assert nb.idx.tolist() == [[0, 5]]                # slot 2 is invalid
    key = reference.unit_rows(torch.randn(1, 16))
    nb = run_op("retrieve", key, torch.empty(0, 16), torch.empty(0, dtype=torch.bool), 4, 0.5, backend="cpu")
    assert nb.idx.tolist() == [[-1] * 4] and nb.weight.abs().sum().item() == 0


@pytest.mark.parametrize("q,n,m,v,k", [(1, 6, 5, 50, 4), (4, 123, 32, 1000, 4), (3, 7, 9, 97, 8)])
def test_cpu_bias_add_is_bit_exact(q, n, m, v, k):
    z, nb, support, bias = make_bias_case(q, n, m, v, k, seed=q * 77 + n)
    got = run_op("bias_add", z, nb, support, bias, gain=0.6, backend="cpu")
    assert torch.equal(got, reference.bias_add(z, nb, support, bias, gain=0.6))
    dense = torch.randn(n, v)
    got = run_op("bias_add", z, nb, None, dense, gain=0.6, backend="cpu")
    assert torch.equal(got, reference.bias_add_dense(z, nb, dense, gain=0.6))


@pytest.mark.parametrize("adaptive", [True, False])
def test_cpu_update_matches_reference(adaptive):
    keys, _, g = make_bank(40, 33, torch.float32, seed=5)
    bias, counts = torch.randn(40, 8, generator=g), torch.randint(0, 5, (40,), generator=g)
    slots = torch.tensor([3, 9, 3, 3, 0])
    residual, h = torch.randn(5, 8, generator=g), torch.randn(5, 33, generator=g)
    got = [keys.clone(), bias.clone(), counts.clone()]
    run_op("update", *got, slots, residual, h, eta=0.1, adaptive=adaptive, backend="cpu")
    want = [keys.clone(), bias.clone(), counts.clone()]
    reference.update(*want, slots, residual, h, eta=0.1, adaptive=adaptive)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=1e-6)
    assert torch.equal(got[2], want[2])


def test_cpu_bank_step_fuses_retrieval_and_bias_add():
    """`CpuBank.step` reads strided h/z rows in place, scans slots [0, hi) of its books' extent
    under the validity mask, records each row's retrieval (empty rows while the bank is empty),
    and writes z + λβ."""
    from drift_cli._bank import Books
    from drift_kernels import cpu
    z, nb0, support, bias = make_bias_case(1, 60, 16, 500, 4, seed=11)
    keys, valid, g = make_bank(60, 24, torch.float32, seed=11, valid_share=0.8)
    h = torch.randn(1, 24, generator=g)
    support = support.long()                          # the bank keys int64 ids

    def cpu_bank(books):
        return cpu.bank(keys, valid, support, bias, torch.zeros(60, dtype=torch.int64), books, "t", k=4, sigma=0.4,
                        gain=0.6, tau=0.9, eta=0.1, adaptive=True, used_weight=1e-3)

    def extend(books, hi):
        """The books hand out slots up to hi; the invalid ones among them are released again."""
        while books.extent()[0] < hi:
            books.allocate("t")
        for s in range(hi):
            if not valid[s] and books.is_valid(s):
                books.release(s)
        assert books.extent() == (hi, int(valid[:hi].sum()))

    books = Books(60)
    bank = cpu_bank(books)
    with pytest.raises(ValueError, match="the extension's own Books"):
        cpu_bank(None)
    hs, zs = torch.randn(1, 3, 24, generator=g), torch.randn(1, 2, 500, generator=g)
    hs[:, -1], zs[:, -1] = h, z                       # rows read in place from [B, T, .] views
    out = np.empty((1, 500), dtype=np.float32)
    bank.begin()
    assert not bank.step(hs[:, -1].numpy(), zs[:, -1].numpy(), out)    # empty: logits unchanged, row recorded
    extend(books, 30)
    for _ in range(20):                               # the record grows; only slots < 30 are scanned
        assert bank.step(h.numpy(), z.numpy(), out)
    extend(books, 60)
    assert bank.step(hs[:, -1].numpy(), zs[:, -1].numpy(), out)
    nb = reference.Neighbours(*(torch.from_numpy(a) for a in bank.drafted(1, 22)))
    want = reference.retrieve(h, keys, valid, 4, 0.4)
    want30 = reference.retrieve(h, keys[:30], valid[:30], 4, 0.4)
    assert nb.idx[0].tolist() == [-1] * 4
    assert bool((nb.idx[1:21] == want30.idx[0]).all()) and bool((nb.idx[1:21] < 30).all())
    assert torch.equal(nb.idx[21], want.idx[0])
    torch.testing.assert_close(nb.weight[21:], want.weight, atol=1e-6, rtol=0)
    last = reference.Neighbours(nb.idx[21:], nb.sim[21:], nb.weight[21:])
    assert torch.equal(torch.from_numpy(out), reference.bias_add(z, last, support, bias, 0.6))
    # a batch of 2: rows were recorded step-major (step 0: b0, b1; ...) and come back batch-major
    books2 = Books(60)
    bank2 = cpu_bank(books2)
    bank2.begin()
    two_h, two_z = torch.cat([hs, hs]), torch.cat([zs, zs])
    bank2.step(two_h[:, -1].numpy(), two_z[:, -1].numpy(), np.empty((2, 500), dtype=np.float32))
    extend(books2, 60)
    bank2.step(two_h[:, -1].numpy(), two_z[:, -1].numpy(), np.empty((2, 500), dtype=np.float32))
    idx = bank2.drafted(2, 2)[0]
    assert idx[0].tolist() == [-1] * 4 and idx[1].tolist() == want.idx[0].tolist()
    assert idx[2].tolist() == [-1] * 4 and idx[3].tolist() == want.idx[0].tolist()
    with pytest.raises(ValueError, match="float32"):
        bank.step(h.double().numpy(), z.numpy(), out)
    with pytest.raises(ValueError, match="disagree"):
        bank.step(h.numpy(), z.numpy(), np.empty((1, 499), dtype=np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        zz = z.numpy().copy()
        bank.step(h.numpy(), zz, zz)




# --- the fused draft step (retrieval + bias add, two launches) and the warm-up --------------------

def make_step_case(q, n, d, m, v, k, dtype, seed, ties=False):
    z, _, support, bias = make_bias_case(q, n, max(m, 1), v, k, seed)
    keys, valid, g = make_bank(n, d, dtype, seed=seed, valid_share=0.8)
    if ties:                                      # equal keys: similarities tie exactly in any order
        keys[5:n:7] = keys[3]
    h = torch.randn(q, d, generator=g, dtype=torch.float32).to(dtype) * 2.0
    if ties:
        h[0] = keys[3].float() * 3.0
    if m == 0:
        support, bias = None, torch.randn(n, v, generator=g)
    return h, z, keys, valid, support, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q,n,d,m,v,k,ties", [(1, 123, 48, 8, 300, 4, True), (3, 40, 20, 5, 97, 2, False),
                                               (2, 9, 17, 0, 130, 8, False), (1, 70, 24, 4, 50, 1, True)])
def test_draft_step_matches_retrieval_then_bias_add(dtype, q, n, d, m, v, k, ties):
    h, z, keys, valid, support, bias = make_step_case(q, n, d, m, v, k, dtype, seed=n + v, ties=ties)
    zs = torch.randn(q, 3, v)                     # z rows read in place from a [Q, T, V] view
    zs[:, 1] = z
    before = zs.clone()
    got, nb = run_op("draft_step", h, zs[:, 1], keys, valid, support, bias, k, 0.4, 0.7, backend="triton")
    want_nb = reference.retrieve(h, keys, valid, k, 0.4)
    assert torch.equal(nb.idx, want_nb.idx)       # ties included: the lower slot first
    live = want_nb.idx >= 0
    torch.testing.assert_close(nb.sim[live], want_nb.sim[live], atol=TOL[dtype][0], rtol=0)
    assert bool(torch.isinf(nb.sim[~live]).all()) and bool((nb.weight[~live] == 0).all())
    torch.testing.assert_close(nb.weight, want_nb.weight, atol=TOL[dtype][0], rtol=0)
    # the bias add of the kernel's own neighbours is the reference's, bit for bit
    add = reference.bias_add if m else (lambda z_, nb_, _s, b_, g_: reference.bias_add_dense(z_, nb_, b_, g_))
    assert torch.equal(got, add(z, nb, support, bias, 0.7))
    assert torch.equal(zs, before)                # the input logits are not modified


@pytest.mark.parametrize("m", [4, 0])
def test_draft_step_of_an_empty_or_invalid_bank_leaves_the_logits(m):
    h, z, keys, valid, support, bias = make_step_case(2, 12, 16, m, 40, 3, torch.float32, seed=3)
    for n, share in [(0, None), (12, 0.0)]:
        valid_n = torch.zeros(n, dtype=torch.bool) if share == 0.0 else valid[:n]
        got, nb = run_op("draft_step", h, z, keys[:n], valid_n, support, bias, 3, 0.4, 0.7, backend="triton")
        assert torch.equal(got, z) and nb.idx.tolist() == [[-1] * 3] * 2
        assert nb.weight.abs().sum().item() == 0.0


class KernelLog:
    """Wraps the Triton kernels of drift_kernels to record each launch by name (`inside` is true
    while a launch runs, which under the interpreter includes the kernel's own execution)."""

    def __init__(self, monkeypatch):
        from drift_kernels import bias, prototype_update, retrieval, step
        self.names, self.inside = [], False
        for mod in (bias, prototype_update, retrieval, step):
            for name, obj in list(vars(mod).items()):
                if name.endswith("_kernel") and hasattr(obj, "__getitem__"):
                    monkeypatch.setattr(mod, name, self._wrap(name, obj))

    def _wrap(self, name, kernel):
        log = self

        def launch(grid, *args, **kwargs):
            log.names.append(name)
            log.inside = True
            try:
                return kernel[grid](*args, **kwargs)
            finally:
                log.inside = False

        class Logged:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: launch(grid, *args, **kwargs)
        return Logged()


def test_draft_step_is_two_launches_with_no_fill_copy_or_sync(monkeypatch):
    """Host work per draft token: `torch.empty` and two kernel launches, nothing that would launch
    a fill or copy kernel or wait for the device."""
    from torch.overrides import TorchFunctionMode

    from drift_kernels import step
    case = make_step_case(2, 123, 48, 8, 300, 4, torch.float16, seed=1)
    h, z, keys, valid, support, bias = (_to(x, KERNEL_DEVICE) for x in case)
    forbidden = {"full", "zeros", "ones", "full_like", "zeros_like", "clone", "contiguous", "copy_", "fill_",
                 "item", "to", "cpu", "cuda", "tolist", "nonzero", "synchronize", "__bool__", "masked_fill"}
    for sup, table in [(support, bias), (None, torch.randn(123, 300, device=KERNEL_DEVICE))]:
        log = KernelLog(monkeypatch)
        calls = []

        class HostOps(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if not log.inside:
                    calls.append(getattr(func, "__name__", str(func)))
                return func(*args, **(kwargs or {}))

        with HostOps():
            step.draft_step(h, z, keys, valid, sup, table, 4, 0.4, 0.7)
        assert log.names == ["_tile_topk_kernel", "_merge_sparse_bias_kernel" if sup is not None
                             else "_merge_dense_bias_kernel"]
        assert step.LAUNCHES_PER_STEP == len(log.names)
        assert "empty" in calls
        assert not forbidden & set(calls), sorted(forbidden & set(calls))


@pytest.mark.parametrize("m", [4, 0])
def test_warm_up_launches_every_kernel_of_the_drift_method(monkeypatch, m):
    log = KernelLog(monkeypatch)
    launches = drift_kernels.warm_up(KERNEL_DEVICE, d=24, m=m, k=2, dtype=torch.float32, bank_size=40, vocab=50,
                                     positions=2)
    assert launches == len(log.names) > 0
    merge = "_merge_sparse_bias_kernel" if m else "_merge_dense_bias_kernel"
    assert set(log.names) == {"_tile_topk_kernel", merge, "_merge_kernel", "_update_kernel"}
    # N 40 with BLOCK_N 16 and k 2: one candidate block; the update at 1 and 2 positions
    assert log.names.count("_update_kernel") == 2


def test_warm_up_is_a_no_op_off_the_triton_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert drift_kernels.warm_up("cpu", d=24, m=4, k=2, dtype=torch.float32) == 0
