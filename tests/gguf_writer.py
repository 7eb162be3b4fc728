"""Write a Hugging Face Llama (and its byte-level BPE tokenizer) as a GGUF file, for tests.

The tensors follow llama.cpp's names and layout: matrices are stored [out, in] as numpy arrays
(GGUF lists the dimensions innermost first), and the query and key projections are permuted
into llama.cpp's interleaved rotary order, which transformers' GGUF loader undoes. Getting that
wrong changes the logits, so the round-trip test checks it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF rotary layout -> llama.cpp's (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model) -> dict[str, np.ndarray]:
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            w = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = _permute(w, cfg.num_attention_heads)
            elif gg == "attn_k":
                w = _permute(w, cfg.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = w
    return out


def write_gguf(path: Path, model, tokenizer, architecture: str = "llama") -> Path:
    """`model` (LlamaForCausalLM) and `tokenizer` (byte-level BPE, fast) as one F32 GGUF file."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in spec.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    for name, t in _tensors(model).items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_gguf_model(vocab: int, seed: int = 0, tied: bool = True):
    """A random-init Llama whose shapes the GGUF path supports (tied head, like SmolLM2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, rms_norm_eps=1e-5)
    return LlamaForCausalLM(cfg).eval()
