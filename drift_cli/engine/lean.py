"""The Llama decoder's inference forward on the CPU in as few operations as its arithmetic needs.

On a CPU a step that scores a few tokens should cost one read of the weights (docs/engine.md, "The
CPU forward"). With the linear layers at that floor (`cpu_linear`), what is left of a step is the
forward around them: transformers' Llama forward spends about a third of a one-token step of
SmolLM2-135M outside its linear layers (its `DynamicCache` concatenating every layer's keys and
values each step, the rotary embedding's `rotate_half` concatenations, 61 RMSNorms of five
operations each, the module calls of 30 layers and the mask bookkeeping).

`LeanDecoder` runs the same arithmetic over the same parameters (read at every call, never
copied: OSD updates a draft's weights in place) with one fused operation where transformers
runs several:

  * RMSNorm: `F.rms_norm` (one kernel; transformers' `LlamaRMSNorm` computes the same
    x · rsqrt(mean(x²) + eps) · weight in five);
  * the rotary embedding: cos/sin once per forward (the model's own `rotary_emb`, so every rope
    type it knows is honoured), applied to q and k together by half-rotation without `cat`;
  * the KV cache written in place (`FlatCache` at batch 1, preallocated, rolled back by setting
    its length; `RowCache` / `SlotCache` for rows), never concatenated;
  * attention: one `scaled_dot_product_attention` call with grouped KV heads, over the cache's
    committed prefix and the new positions, no mask at all for a one-token step;
  * the MLP: `silu(gate) · up` in two element-wise kernels.

At batch 1 (`FlatCache`, at most `MAX_ROWS` positions) the whole step is one call into the
kernel (`DecoderPlan`, `drift_bank_core::layer::decoder_step`): every layer's RMSNorm + q/k/v,
rotation, cache write, attention, o_proj and MLP, then the final norm, with no Python between
them. Rows (`RowCache`) and trees take one call per fused piece (`_fused_layer`).

It serves inference only (the caller holds `torch.inference_mode`), float32 on the CPU, plain
Llama layers (`supports`): anything else (CUDA, other dtypes, attention or MLP biases, other
architectures) keeps transformers' forward. `DRIFT_LEAN_FORWARD=0` keeps transformers' forward
everywhere (the before/after measurements and the equality tests use it); `DRIFT_CPU_LINEAR=0`
turns this off too, so that the "before" of `drift profile` is the whole stock path.

Numerics: the same operations in the same order as transformers' Llama forward except for the
fused RMSNorm and the rotation written without `cat` (both compute the same formula; results may
differ from transformers' by float32 rounding). At batch 1 every operation is per position, so a
position's hidden state and logits are bitwise the same scored alone or among others.
`tests/test_lean.py` holds it to transformers' forward within 1e-5, holds that bitwise equality,
and holds every method's greedy output to `ar`'s on either path.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

from drift_cli.engine import cpu_linear

ENV = "DRIFT_LEAN_FORWARD"


def enabled() -> bool:
    """Whether the lean forward is switched on (the default; off with the skinny GEMM's switch too)."""
    off = ("0", "false", "off", "no")
    return os.environ.get(ENV, "1").strip().lower() not in off and cpu_linear.enabled()


def supports(decoder: torch.nn.Module) -> bool:
    """A plain Llama decoder on the CPU in float32, whose layers this module computes exactly."""
    cfg = getattr(decoder, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama":
        return False
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    try:
        weight = decoder.embed_tokens.weight
        layers = list(decoder.layers[: cfg.num_hidden_layers])
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            _ = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj,
                 layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
        _ = (decoder.norm.variance_epsilon, decoder.rotary_emb)
    except AttributeError:
        return False
    return weight.device.type == "cpu" and weight.dtype is torch.float32 and len(layers) > 0


def make(decoder: torch.nn.Module) -> LeanDecoder | None:
    """The lean forward for `decoder`, or None where transformers' forward stays (see `supports`)."""
    return LeanDecoder(decoder) if enabled() and supports(decoder) else None


class FlatCache:
    """Batch 1's KV cache: every layer's keys and values in one buffer [layers, 2, rows,
    kv_heads, capacity, head_dim] (the layout the one-call step writes), written in place at the
    positions of each forward and rolled back by setting `length` (entries past it are
    overwritten by the next forward). `keys[i]` / `values[i]` are layer i's [rows, kv_heads,
    capacity, head_dim] views. Capacity doubles when a forward would pass it."""

    def __init__(self) -> None:
        self.store: torch.Tensor | None = None
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0              # committed positions
        self._start = self._end = 0

    def begin(self, start: int, width: int) -> None:
        """The next forward writes positions start .. start + width - 1 (start <= length)."""
        self._start, self._end = start, start + width

    def reserve(self, layers: int, rows: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> None:
        """Room for the positions `begin` announced (the committed ones carried over on growth)."""
        old = self.store
        if old is not None and old.shape[4] >= self._end:
            return
        new = like.new_zeros(layers, 2, rows, kv_heads, max(64, 2 * self._end), head_dim)
        if old is not None:
            new[..., :self._start, :] = old[..., :self._start, :]
        self.store, self.keys, self.values = new, list(new[:, 0]), list(new[:, 1])

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int, *args, **kwargs):
        k, v = self.keys[layer], self.values[layer]
        k[:, :, self._start:self._end] = key
        v[:, :, self._start:self._end] = value
        return k[:, :, :self._end], v[:, :, :self._end]

    def get_seq_length(self, layer: int = 0) -> int:
        return self.length

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @property
    def layers(self):
        """Each layer's committed keys and values (views), as `DynamicCache.layers` exposes them."""
        n = self.length
        return [_Layer(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.keys, self.values, strict=True)]


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class LeanDecoder:
    """`decoder(ids, positions, cache, mask, record)` -> (last hidden state [R, S, d], the hidden
    states recorded at the indices in `record`), the same result as transformers' Llama decoder."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        cfg = decoder.config
        self.decoder = decoder
        self.layers = list(decoder.layers[: cfg.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.scale = attn.scaling
        self.half = self.head_dim // 2
        norms = [n for x in self.layers for n in (x.input_layernorm, x.post_attention_layernorm)] + [decoder.norm]
        self.eps = norms[0].variance_epsilon
        self._one_eps = all(n.variance_epsilon == self.eps for n in norms)   # the one-call step takes one
        self._plan = None             # the one-call step's held weights (`_step`), made on first use

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [R, S, H, D] rotated: x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1)."""
        h = self.half
        out = x * cos
        out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1.0)
        out[..., h:].addcmul_(x[..., :h], sin[..., h:])
        return out

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None = None,
                 record: tuple[int, ...] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids, positions [R, S]; mask: an additive [R, 1, S, kv_len] mask, or None for the causal
        one over exactly the cached prefix and the new positions (batch 1)."""
        dec = self.decoder
        r, s = ids.shape
        h = dec.embed_tokens(ids)
        cos, sin = dec.rotary_emb(h, positions)
        cos, sin = cos[:, :, None], sin[:, :, None]                  # [R, S, 1, D] over heads
        if mask is None and s > 1:                                  # causal, bottom-right aligned
            start = int(positions[0, 0])
            visible = torch.ones(s, start + s, dtype=torch.bool).tril_(start)
            mask = torch.zeros(visible.shape, dtype=h.dtype).masked_fill_(~visible, torch.finfo(h.dtype).min)
        threads = torch.get_num_threads()
        flat = isinstance(cache, FlatCache)
        if flat:
            cache.reserve(len(self.layers), r, self.kv_heads, self.head_dim, h)
        if flat and r == 1 and _PLAN is not None and self._one_eps and s <= cpu_linear.MAX_ROWS and threads <= cpu_linear.MAX_THREADS:
            return self._step(h, cos, sin, cache, mask, record, threads)
        captured: dict[int, torch.Tensor] = {}
        if _FUSED is None or r * s > cpu_linear.MAX_ROWS or threads > cpu_linear.MAX_THREADS:
            for i, layer in enumerate(self.layers):
                if i in record:
                    captured[i] = h
                h = self._torch_layer(i, layer, h, cos, sin, cache, mask)
            ln = dec.norm
            return F.rms_norm(h, (h.shape[-1],), ln.weight, ln.variance_epsilon), captured
        # The kernels take the threads; PyTorch's few small operations between them run on one, so
        # that its OpenMP workers, spinning after a parallel region, never contend with the kernels'.
        with _torch_threads(1):
            for i, layer in enumerate(self.layers):
                if i in record:
                    captured[i] = h.clone()                         # the fused layer updates h in place
                h = self._fused_layer(i, layer, h, cos, sin, cache, mask, threads)
            out = torch.empty_like(h)
            _FUSED[3](h, dec.norm.weight, dec.norm.variance_epsilon, out)
        return out, captured

    def _step(self, h, cos, sin, cache: FlatCache, mask, record, threads):
        """One sequence, few positions: every layer in one call of the kernel (`DecoderPlan`)."""
        layers = sorted({i for i in record if i < len(self.layers)})
        recorded = h.new_empty(len(layers), *h.shape) if layers else None
        out = torch.empty_like(h)
        args = (h, cos.contiguous(), sin.contiguous(), cache.store, cache._start, mask, layers, recorded, out, threads)
        if self._plan is None or not self._plan.step(*args):          # built, or rebuilt: a weight moved
            self._plan = self._make_plan()
            if not self._plan.step(*args):
                raise RuntimeError("the decoder's weights moved during a step")
        return out, {i: recorded[j] for j, i in enumerate(layers)}

    def _make_plan(self):
        weights = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            weights += [layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
                        layer.post_attention_layernorm.weight, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight]
        return _PLAN(weights, self.decoder.norm.weight, self.heads, self.kv_heads, self.head_dim, self.eps, self.scale)

    def _qkv_rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """[R, S, (Hq + 2 Hkv) · D] -> q [R, S, Hq, D] and k [R, S, Hkv, D] rotated, v [R, S, Hkv, D]."""
        r, s, _ = qkv.shape
        hd, nq, nkv = self.head_dim, self.heads, self.kv_heads
        qk = self._rope(qkv[..., :(nq + nkv) * hd].view(r, s, nq + nkv, hd), cos, sin)
        return qk[:, :, :nq], qk[:, :, nq:], qkv[..., (nq + nkv) * hd:].view(r, s, nkv, hd)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(q·Kᵀ·scale + mask)·V for few queries, grouped KV heads in one batched matmul
        (no repeated keys); q [R, S, Hq, D], keys/values [R, Hkv, L, D] -> [R, S, Hq · D]."""
        r, s, nq, hd = q.shape
        nkv = self.kv_heads
        g = nq // nkv
        qh = (q * self.scale).view(r, s, nkv, g, hd).permute(0, 2, 1, 3, 4).reshape(r, nkv, s * g, hd)
        scores = torch.matmul(qh, keys.transpose(-1, -2))                     # [R, Hkv, S·G, L]
        if mask is not None:
            length = scores.shape[-1]
            scores = (scores.view(r, nkv, s, g, length) + mask.view(-1, 1, s, 1, length)).view(r, nkv, s * g, length)
        out = torch.matmul(torch.softmax(scores, dim=-1), values)            # [R, Hkv, S·G, D]
        return out.view(r, nkv, s, g, hd).permute(0, 2, 1, 3, 4).reshape(r, s, nq * hd)

    def _fused_layer(self, i, layer, h, cos, sin, cache, mask, threads):
        """Few rows: the Rust kernels' RMSNorm + q/k/v, o_proj into the residual, the whole MLP,
        on `threads` threads."""
        attn, mlp = layer.self_attn, layer.mlp
        r, s, _ = h.shape
        ln = layer.input_layernorm
        qkv = h.new_empty(r, s, (self.heads + 2 * self.kv_heads) * self.head_dim)
        _FUSED[0](h, ln.weight, ln.variance_epsilon, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
                  qkv, False, threads)
        q, k, v = self._qkv_rope(qkv, cos, sin)
        keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), i)
        if s == 1:                      # one query per row: the kernel (no matmul's set-up)
            o = h.new_empty(r, s, self.heads * self.head_dim)
            _FUSED[2](q, keys, values, mask, self.scale, o, threads)
        else:                           # several: PyTorch's batched matmul over grouped heads
            o = self._attend(q, keys, values, mask)
        _FUSED[0](o, None, 0.0, [attn.o_proj.weight], h, True, threads)           # h += o · Woᵀ
        ln = layer.post_attention_layernorm
        _FUSED[1](h, ln.weight, ln.variance_epsilon, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                  threads)
        return h

    def _torch_layer(self, i, layer, h, cos, sin, cache, mask):
        """Many rows (a prefill) or more threads than the kernels serve: PyTorch's operations."""
        attn, mlp = layer.self_attn, layer.mlp
        r, s, _ = h.shape
        ln = layer.input_layernorm
        x = F.rms_norm(h, (h.shape[-1],), ln.weight, ln.variance_epsilon)
        qkv = torch.cat([F.linear(x, attn.q_proj.weight), F.linear(x, attn.k_proj.weight),
                         F.linear(x, attn.v_proj.weight)], dim=-1)
        q, k, v = self._qkv_rope(qkv, cos, sin)
        keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), i)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.heads != self.kv_heads)
        h = h + F.linear(o.transpose(1, 2).reshape(r, s, -1), attn.o_proj.weight)
        ln = layer.post_attention_layernorm
        x = F.rms_norm(h, (h.shape[-1],), ln.weight, ln.variance_epsilon)
        return h + F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight),
                            mlp.down_proj.weight)


@contextlib.contextmanager
def _torch_threads(n: int):
    """PyTorch's intra-op thread count set to n within the block (restored after)."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _kernels():
    try:
        from drift_cli._bank import DecoderPlan, attend_few, rms_norm, skinny_mlp, skinny_norm_linear
    except ImportError:          # an extension built before the fused kernels existed
        return None, None
    return (skinny_norm_linear, skinny_mlp, attend_few, rms_norm), DecoderPlan


_FUSED, _PLAN = _kernels()
