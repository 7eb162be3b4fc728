"""Llama configs for the zoo, their sizes and per-token compute.

Per-token FLOPs (forward, one token at context length `ctx`), counting every matmul:
    2 * (matmul weights of all layers + lm_head)  +  layers * 4 * ctx * hidden   (QK^T and AV)
Embedding lookups, norms and activations are not matmuls and are left out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from drift_cli.zoo.presets import ModelShape


def llama_config(shape: ModelShape, vocab_size: int, eos_id: int, pad_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def new_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def matmul_weights_per_layer(shape: ModelShape) -> int:
    head_dim = shape.hidden // shape.heads
    attn = shape.hidden * head_dim * (2 * shape.heads + 2 * shape.kv_heads)   # q, o, k, v
    mlp = 3 * shape.hidden * shape.ffn                                          # gate, up, down
    return attn + mlp


def per_token_flops(shape: ModelShape, vocab_size: int, ctx: int | None = None) -> int:
    ctx = shape.context if ctx is None else ctx
    weights = shape.layers * matmul_weights_per_layer(shape) + shape.hidden * vocab_size  # + lm_head
    return 2 * weights + shape.layers * 4 * ctx * shape.hidden


def weights_sha256(checkpoint: Path) -> str:
    """sha256 over the checkpoint's safetensors files (sorted by name)."""
    h = hashlib.sha256()
    for f in sorted(checkpoint.glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
