"""Write tiny EAGLE-1 and EAGLE-3 heads in the layouts vLLM, SGLang and SpecForge read, for tests,
and compute their logits with a plain reference forward written here from the layouts alone.

The writer and the reference use none of drift_cli.eagle: a head the loader misreads (a weight
under the wrong name, q/k/v reading the halves in the wrong order, a residual taken from the
wrong side of a norm, d2t applied the wrong way, a target state from the wrong layer) gives other
logits than the reference, which reads the target's states through Hugging Face's own
`output_hidden_states` (index k: the input of layer k; the last: after the final norm).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def _config(target, **extra) -> dict:
    tc = target.config
    out = {"model_type": "llama", "hidden_size": tc.hidden_size, "intermediate_size": tc.intermediate_size,
           "num_attention_heads": tc.num_attention_heads, "num_key_value_heads": tc.num_key_value_heads,
           "head_dim": tc.hidden_size // tc.num_attention_heads, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "rope_theta": 10000.0, "max_position_embeddings": 512, "vocab_size": tc.vocab_size,
           "tie_word_embeddings": False}
    out.update(extra)
    return out


def _random(shape, g, std=0.2):
    return torch.randn(*shape, generator=g) * std


def _norm(d, g):
    return 1.0 + 0.1 * torch.randn(d, generator=g)


def write_eagle3(path: Path, target, *, draft_vocab: list[int] | None = None, aux: list[int] | None = None,
                 seed: int = 0, hidden: int | None = None, target_hidden: int | None = None, own_embed: bool = False,
                 d2t_shift: int = 0, norm_before_residual: bool = False, config: dict | None = None,
                 architecture: str | None = "LlamaForCausalLMEagle3") -> Path:
    """An EAGLE-3 head (random weights) for `target`: draft vocabulary `draft_vocab` (target ids,
    default all), fusing the target's states at `aux`. hidden / target_hidden / d2t_shift make it
    not fit (tests of the refusals)."""
    g = torch.Generator().manual_seed(seed)
    tc = target.config
    d = hidden or tc.hidden_size
    dt = tc.hidden_size
    heads, kv = tc.num_attention_heads, tc.num_key_value_heads
    hd = d // heads
    vocab_ids = torch.tensor(draft_vocab if draft_vocab is not None else range(tc.vocab_size))
    k = vocab_ids.numel()
    aux = list(aux if aux is not None else [0, tc.num_hidden_layers // 2, tc.num_hidden_layers - 1])
    w = {
        "fc.weight": _random((d, len(aux) * dt), g, 0.1),
        "midlayer.input_layernorm.weight": _norm(d, g),
        "midlayer.hidden_norm.weight": _norm(d, g),
        "midlayer.self_attn.q_proj.weight": _random((heads * hd, 2 * d), g),
        "midlayer.self_attn.k_proj.weight": _random((kv * hd, 2 * d), g),
        "midlayer.self_attn.v_proj.weight": _random((kv * hd, 2 * d), g),
        "midlayer.self_attn.o_proj.weight": _random((d, heads * hd), g),
        "midlayer.post_attention_layernorm.weight": _norm(d, g),
        "midlayer.mlp.gate_proj.weight": _random((tc.intermediate_size, d), g),
        "midlayer.mlp.up_proj.weight": _random((tc.intermediate_size, d), g),
        "midlayer.mlp.down_proj.weight": _random((d, tc.intermediate_size), g),
        "norm.weight": _norm(d, g),
        "lm_head.weight": _random((k, d), g, 1.0),
        "d2t": (vocab_ids - torch.arange(k) + d2t_shift).long(),
    }
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[vocab_ids] = True
    w["t2d"] = t2d
    if own_embed:
        w["embed_tokens.weight"] = _random((tc.vocab_size, d), g, 1.0)
    cfg = _config(target, hidden_size=d, head_dim=hd, num_hidden_layers=1, draft_vocab_size=k,
                  target_hidden_size=target_hidden or dt, norm_before_residual=norm_before_residual,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
                  **(config or {}))
    if architecture:
        cfg["architectures"] = [architecture]
    return _save(path, cfg, w)


def write_eagle1(path: Path, target, *, seed: int = 0, fc_bias: bool = True, layers: int = 1,
                 architecture: str | None = "LlamaForCausalLMEagle", hidden: int | None = None) -> Path:
    """An EAGLE-1 head (random weights) in yuhuili's layout (fc with a bias; no lm_head: the target's)."""
    g = torch.Generator().manual_seed(seed)
    tc = target.config
    d = hidden or tc.hidden_size
    heads, kv = tc.num_attention_heads, tc.num_key_value_heads
    hd = d // heads
    w = {"fc.weight": _random((d, 2 * d), g, 0.1)}
    if fc_bias:
        w["fc.bias"] = _random((d,), g, 0.1)
    for i in range(layers):
        p = f"layers.{i}."
        w.update({
            p + "self_attn.q_proj.weight": _random((heads * hd, d), g),
            p + "self_attn.k_proj.weight": _random((kv * hd, d), g),
            p + "self_attn.v_proj.weight": _random((kv * hd, d), g),
            p + "self_attn.o_proj.weight": _random((d, heads * hd), g),
            p + "post_attention_layernorm.weight": _norm(d, g),
            p + "mlp.gate_proj.weight": _random((tc.intermediate_size, d), g),
            p + "mlp.up_proj.weight": _random((tc.intermediate_size, d), g),
            p + "mlp.down_proj.weight": _random((d, tc.intermediate_size), g),
        })
        if i > 0:
            w[p + "input_layernorm.weight"] = _norm(d, g)
    cfg = _config(target, hidden_size=d, head_dim=hd, num_hidden_layers=layers)
    if architecture:
        cfg["architectures"] = [architecture]
    return _save(path, cfg, w)


def _save(path: Path, config: dict, weights: dict) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


# -- the reference forward: full sequence, no cache, from the layout alone ------------------------

def _load(path: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    return json.loads((Path(path) / "config.json").read_text()), load_file(str(Path(path) / "model.safetensors"))


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, theta):
    """x [H, S, hd] at positions 0..S-1 (Llama's rotate-half convention)."""
    hd, s = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + half * sin


def _attention(x, w, prefix, cfg):
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s = x.shape[0]
    q = (x @ w[prefix + "q_proj.weight"].T).view(s, heads, hd).transpose(0, 1)
    k = (x @ w[prefix + "k_proj.weight"].T).view(s, kv, hd).transpose(0, 1)
    v = (x @ w[prefix + "v_proj.weight"].T).view(s, kv, hd).transpose(0, 1)
    q, k = _rope(q, cfg["rope_theta"]), _rope(k, cfg["rope_theta"])
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(s, heads * hd)
    return out @ w[prefix + "o_proj.weight"].T


def _mlp(x, w, prefix):
    gate = x @ w[prefix + "gate_proj.weight"].T
    return (torch.nn.functional.silu(gate) * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


@torch.no_grad()
def reference_logits(path: Path, target, ids: list[int]) -> torch.Tensor:
    """The head's logits [L-1, V] over the target's vocabulary for the pairs (state i, token i+1)
    of `ids`, i = 0..L-2 (-inf outside a reduced draft vocabulary)."""
    cfg, w = _load(path)
    x = torch.tensor([ids])
    out = target(input_ids=x, output_hidden_states=True)
    states = out.hidden_states                                 # (L + 1) x [1, L, d_t]
    tokens = x[0, 1:]
    eps = cfg["rms_norm_eps"]
    embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight)
    vocab = target.config.vocab_size
    if "midlayer.hidden_norm.weight" in w:                      # EAGLE-3
        aux = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        f = torch.cat([states[k][0, :-1] for k in aux], -1)     # [L-1, n·d_t]
        gstate = f @ w["fc.weight"].T
        e = _rms(embed[tokens], w["midlayer.input_layernorm.weight"], eps)
        h = _rms(gstate, w["midlayer.hidden_norm.weight"], eps)
        residual = h if cfg.get("norm_before_residual") else gstate
        residual = residual + _attention(torch.cat([e, h], -1), w, "midlayer.self_attn.", cfg)
        prenorm = residual + _mlp(_rms(residual, w["midlayer.post_attention_layernorm.weight"], eps), w, "midlayer.mlp.")
        small = _rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T      # [L-1, K]
        logits = torch.full((small.shape[0], vocab), float("-inf"))
        logits[:, torch.arange(small.shape[1]) + w["d2t"]] = small
        return logits
    f = states[-1][0, :-1]                                      # EAGLE-1: the final state, after the norm
    h = torch.cat([embed[tokens], f], -1) @ w["fc.weight"].T + w.get("fc.bias", 0.0)
    for i in range(cfg.get("num_hidden_layers", 1)):
        p = f"layers.{i}."
        a = h if i == 0 else _rms(h, w[p + "input_layernorm.weight"], eps)
        h = h + _attention(a, w, p + "self_attn.", cfg)
        h = h + _mlp(_rms(h, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
    head = w.get("lm_head.weight", target.get_output_embeddings().weight)
    return h @ head.T
