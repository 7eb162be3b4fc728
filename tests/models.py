"""Tiny random-init Llama pairs built from a config (no files, no training)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 48, hidden: int = 32, layers: int = 2, seed: int = 0, scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    if scale != 1.0:  # sharpen the output distribution so greedy runs have long agreements
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
    return model


def tiny_pair(vocab: int = 48, seed: int = 0, scale: float = 1.0):
    """(draft, target): different seeds and sizes, same vocabulary."""
    return tiny_llama(vocab, 32, 1, seed + 1, scale), tiny_llama(vocab, 48, 2, seed, scale)
