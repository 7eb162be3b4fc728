"""EAGLE-1 and EAGLE-3 heads as torch modules, with the parameter names of their checkpoints.

One step of a head reads, at each position i, a token x_{i+1} and a state g_i of dimension d:
the fused target state at position i (`fuse(features)`) where the target has scored position i,
and the head's own `carry` from position i-1 where it has not (drafting past the committed
sequence). It returns the lm_head input (the hidden state DRIFT keys on) and the next carry.

  EAGLE-1: x = fc(cat(embed(x_{i+1}), g_i)); the decoder layers (layer 0 without input norm);
           hidden = carry = x, scored by the target's lm_head (the head's own if it has one).
           f_i is the target's final state after its norm, the lm_head input (hidden-state index L).
  EAGLE-3: g_i = fc(cat(target states at the aux layers)) [3·d_t -> d]; e = input_layernorm(embed);
           h = hidden_norm(g) with residual g (residual h when `norm_before_residual`);
           attention over cat(e, h) (q/k/v take 2d); residual add; post_attention_layernorm; mlp;
           residual add -> prenorm; hidden = norm(prenorm) over the head's draft vocabulary;
           carry = prenorm (fed back without fc).

Position ids are the target's: position i for the pair (g_i, x_{i+1}). The target's embeddings (and
EAGLE-1's lm_head) are shared with the target and frozen: they are no parameters of the head, and
a copy of the head (OSD's) shares them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, repeat_kv,
                                                      rotate_half)

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TargetParts:
    """What a head borrows from its target (held outside the module tree: never trained, never copied)."""

    embed: nn.Module
    lm_head: nn.Module


class HeadAttention(nn.Module):
    """Llama attention whose q/k/v read `in_features` (EAGLE-3: 2d); keys/values through a
    `RowCache` (drafting) or after `prefix` keys (training-time test)."""

    def __init__(self, config, in_features: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """x [R, S, in] -> this step's (keys, values) [R, H_kv, S, hd], the keys rotated."""
        r, s, _ = x.shape
        k = self.k_proj(x).view(r, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(r, s, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, layer: int,
                cache=None, prefix: KV | None = None) -> tuple[torch.Tensor, KV]:
        """x [R, S, in], mask [R or 1, 1, S, keys] additive -> ([R, S, d], this step's (keys, values))."""
        r, s, _ = x.shape
        q = rotate(self.q_proj(x).view(r, s, self.heads, self.head_dim).transpose(1, 2), cos, sin)   # [R, H, S, hd]
        k, v = new = self.keys_values(x, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, layer)
        elif prefix is not None:
            k, v = torch.cat([prefix[0], k], dim=2), torch.cat([prefix[1], v], dim=2)
        groups = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(r, s, -1)), new


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [R, H, S, hd] at cos/sin [R, S, hd] (Llama's, as transformers applies it)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def causal_mask(steps: int, step: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive mask [1, 1, S, (step+1)·S] of unrolled step `step` (0-based) over S positions:
    query i sees the first step's keys j <= i - step (real states) and, of each later step t, the
    key at i - step + t (its own drafting chain), as drafting does (EAGLE-3's training-time test).
    Step 0 is the plain causal mask."""
    i = torch.arange(steps, device=device)[:, None]
    j = torch.arange(steps, device=device)[None, :]
    blocks = [j <= i - step] + [j == i - step + t for t in range(1, step + 1)]
    visible = torch.cat(blocks, dim=1)
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


class EagleHead(nn.Module):
    """What both kinds share: the borrowed target parts, the rotary embedding, fusing, training forwards."""

    eagle_kind = ""

    def __init__(self, config, target_layers: tuple[int, ...], target: TargetParts) -> None:
        super().__init__()
        self.config = config
        self.target_layers = tuple(target_layers)     # hidden-state indices of the target it reads
        self.rotary = LlamaRotaryEmbedding(config)
        self.embed_tokens: nn.Embedding | None = None  # its own, when the checkpoint has one
        self._target = target

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.get_input_embeddings()(ids)

    def get_input_embeddings(self) -> nn.Module:
        return self._target.embed if self.embed_tokens is None else self.embed_tokens

    @property
    def feature_dim(self) -> int:
        """F: the width of the target features it reads (its target_layers' states, concatenated)."""
        return self.config.hidden_size

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., F] -> the state g [..., d] a real position feeds."""
        return features

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What training may change: every parameter of the head but its embeddings."""
        return [p for name, p in self.named_parameters() if not name.startswith("embed_tokens.")]

    def __deepcopy__(self, memo):
        memo[id(self._target)] = self._target          # a copy of the head shares the target's parts
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    def forward(self, ids: torch.Tensor, g: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                cache=None, prefix: list[KV] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[KV]]:
        """ids [R, S] (x_{i+1}), g [R, S, d], position_ids [R, S] -> (hidden [R, S, d] (the lm_head
        input), carry [R, S, d], this step's keys/values per layer)."""
        raise NotImplementedError

    def fill(self, ids: torch.Tensor, g: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache) -> None:
        """A re-prefill: write these positions' keys/values into `cache` and compute nothing the
        cache does not hold (no hidden state, no carry; the last layer's keys and values only)."""
        raise NotImplementedError

    def unroll(self, ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training: ids [R, L], features [R, L-1, F] (the target's at positions 0..L-2) -> the
        hidden states [R, L-1, d] of each of `steps` unrolled steps. Step 0 reads the real states
        (teacher forcing); step s reads at position i the head's carry from step s-1 at i-1 and
        attends as drafting does (`causal_mask`). Position i's hidden predicts x_{i+2}; in step s
        only positions i >= s have a real chain behind them."""
        tok = ids[:, 1:]
        r, s = tok.shape
        pos = torch.arange(s, device=tok.device)[None].expand(r, -1)
        g = self.fuse(features[:, :s])
        prefix: list[KV] | None = None
        out = []
        for step in range(steps):
            mask = causal_mask(s, step, g.dtype, g.device)
            hidden, carry, kv = self(tok, g, pos, mask, prefix=prefix)
            prefix = kv if prefix is None else [(torch.cat([pk, k], 2), torch.cat([pv, v], 2))
                                                for (pk, pv), (k, v) in zip(prefix, kv, strict=True)]
            out.append(hidden)
            g = torch.cat([torch.zeros_like(carry[:, :1]), carry[:, :-1]], dim=1)
        return out

    def teacher_forced(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """ids [R, L], features [R, L-1, F] -> hidden [R, L-1, d] on real states only."""
        return self.unroll(ids, features, 1)[0]


class Eagle3Midlayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn = HeadAttention(config, 2 * d)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)


class Eagle3Head(EagleHead):
    eagle_kind = "eagle3"

    def __init__(self, config, target_layers: tuple[int, ...], target: TargetParts, target_hidden: int,
                 draft_vocab: int) -> None:
        super().__init__(config, target_layers, target)
        d = config.hidden_size
        self.fc = nn.Linear(len(target_layers) * target_hidden, d, bias=False)
        self.midlayer = Eagle3Midlayer(config)
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def feature_dim(self) -> int:
        return self.fc.in_features

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def _attention_input(self, ids: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (cat(e, h) [R, S, 2d], h): what the midlayer's q/k/v read."""
        m = self.midlayer
        h = m.hidden_norm(g)
        return torch.cat([m.input_layernorm(self.embed(ids)), h], dim=-1), h

    def forward(self, ids, g, position_ids, mask, cache=None, prefix=None):
        cos, sin = self.rotary(g, position_ids)
        m = self.midlayer
        x, h = self._attention_input(ids, g)
        residual = h if self.norm_before_residual else g
        attn, kv = m.self_attn(x, cos, sin, mask, 0, cache, None if prefix is None else prefix[0])
        residual = residual + attn
        prenorm = residual + m.mlp(m.post_attention_layernorm(residual))
        return self.norm(prenorm), prenorm, [kv]

    def fill(self, ids, g, position_ids, mask, cache):
        cos, sin = self.rotary(g, position_ids)                # one layer: its keys/values alone
        cache.update(*self.midlayer.self_attn.keys_values(self._attention_input(ids, g)[0], cos, sin), 0)


class Eagle1Layer(nn.Module):
    def __init__(self, config, first: bool) -> None:
        super().__init__()
        d = config.hidden_size
        if not first:                                  # layer 0 reads fc's output as it is
            self.input_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn = HeadAttention(config, d)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)


class Eagle1Head(EagleHead):
    eagle_kind = "eagle"

    def __init__(self, config, target_layers: tuple[int, ...], target: TargetParts, fc_bias: bool,
                 own_lm_head: bool) -> None:
        super().__init__(config, target_layers, target)
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=fc_bias)
        self.layers = nn.ModuleList([Eagle1Layer(config, i == 0) for i in range(config.num_hidden_layers)])
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False) if own_lm_head else None

    def get_output_embeddings(self) -> nn.Module:
        return self._target.lm_head if self.lm_head is None else self.lm_head

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The fc and the layers (the lm_head, its own or the target's, stays as it is)."""
        return [p for name, p in self.named_parameters() if name.startswith(("fc.", "layers."))]

    def forward(self, ids, g, position_ids, mask, cache=None, prefix=None):
        return self._layers(ids, g, position_ids, mask, cache, prefix)

    def fill(self, ids, g, position_ids, mask, cache):
        self._layers(ids, g, position_ids, mask, cache, fill=True)

    def _layers(self, ids, g, position_ids, mask, cache=None, prefix=None, fill=False):
        """The layers in turn; fill: the last one's keys/values into the cache, and stop there."""
        x = self.fc(torch.cat([self.embed(ids), g], dim=-1))
        cos, sin = self.rotary(x, position_ids)
        kvs = []
        for i, layer in enumerate(self.layers):
            h = x if i == 0 else layer.input_layernorm(x)
            if fill and i == len(self.layers) - 1:
                cache.update(*layer.self_attn.keys_values(h, cos, sin), i)
                return None
            attn, kv = layer.self_attn(h, cos, sin, mask, i, cache, None if prefix is None else prefix[i])
            x = x + attn
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            kvs.append(kv)
        return x, x, kvs
