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


TEXT = (
    "Speculative decoding drafts tokens with a small model and verifies them with a large one. "
    "The target accepts a drafted token when it agrees; otherwise it emits a correction. "
) * 20


def tiny_tokenizer(vocab: int = 300, text: str = TEXT, extra: str = ""):
    """A byte-level BPE PreTrainedTokenizerFast trained on `text` (+ `extra` to change the vocab)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text + extra], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def save_checkpoint(path, model, tokenizer):
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def saved_pair(root, vocab: int = 300, draft_extra: str = ""):
    """(draft_dir, target_dir) of tiny random models with trained tokenizers saved beside them."""
    ttok = tiny_tokenizer(vocab)
    dtok = tiny_tokenizer(vocab, extra=draft_extra) if draft_extra else ttok
    draft, target = tiny_llama(len(dtok), 32, 1, 1), tiny_llama(len(ttok), 48, 2, 0)
    return save_checkpoint(root / "draft", draft, dtok), save_checkpoint(root / "target", target, ttok)
