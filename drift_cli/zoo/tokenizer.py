"""The one byte-level BPE tokenizer that every zoo model shares.

Trained with the `tokenizers` library on (a budgeted, domain-balanced slice of) the target's
training text, wrapped as a `PreTrainedTokenizerFast` so that `AutoTokenizer.from_pretrained(dir)`
loads it from every checkpoint directory. `<|endoftext|>` is BOS and EOS (GPT-2 style: it separates
documents); `<|pad|>` pads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOS, PAD)   # ids 0 and 1


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over `texts` (order matters only for ties; callers pass a fixed order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),   # all 256 bytes: nothing is ever <unk>
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=1 << 30)


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Token ids per text, each followed by EOS (the document separator)."""
    if not texts:
        return []
    eos = tokenizer.eos_token_id
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [row + [eos] for row in ids]


def budgeted(texts_by_group: list[list[str]], max_chars: int) -> Iterator[str]:
    """Round-robin over groups (domains) until `max_chars` are yielded: every domain gets merges."""
    cursors = [0] * len(texts_by_group)
    left = max_chars
    while left > 0 and any(c < len(g) for c, g in zip(cursors, texts_by_group)):
        for i, group in enumerate(texts_by_group):
            if cursors[i] < len(group) and left > 0:
                text = group[cursors[i]][:left]
                cursors[i] += 1
                left -= len(text)
                yield text
