"""A causal LM with a KV cache that rolls back by cropping.

Wraps any Hugging Face causal LM that exposes a decoder (`get_decoder()`) and an output
embedding (`get_output_embeddings()`): the decoder's last hidden state is exactly the input to
`lm_head`, which DRIFT keys on. A draft with a vocabulary subset scores only its subset
(`drift_cli.engine.head`). The cache is never re-prefilled after a rejection: it is cropped.

transformers 5.x renamed the forward argument `past_key_values` to `cache` and made
`DynamicCache.crop` take a negative count of tokens to drop; `_cache_kwarg` and `_drop` adapt to
the installed version (tested on 5.17 and the newest release).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from drift_cli.engine.head import OutputHead
from drift_cli.engine.timing import IterationClock, NullClock


def _cache_kwarg(decoder: torch.nn.Module) -> str:
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _drop(cache: DynamicCache, n: int) -> None:
    """Drop the last n positions from every layer of the cache."""
    if n > 0:
        cache.crop(-n)


class CausalLM:
    """One model plus its KV cache. `cache_len` counts the positions the cache holds."""

    def __init__(self, model: torch.nn.Module, name: str = "model") -> None:
        self.model = model.eval()
        self.name = name
        self.decoder = model.get_decoder()
        self.head = OutputHead(model)
        self._kw = _cache_kwarg(self.decoder)
        self.cache: DynamicCache | None = None
        self.cache_len = 0
        self.clock: IterationClock = NullClock()
        self.forward_calls = 0

    @property
    def device(self) -> torch.device:
        return self.head.linear.weight.device

    @property
    def vocab_size(self) -> int:
        return self.head.vocab_size

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache_len = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ids [B, S] after the cached prefix; return (hidden [B, S, d], logits [B, S, V] fp32)."""
        if self.cache is None:
            self.reset()
        s = ids.shape[1]
        pos = torch.arange(self.cache_len, self.cache_len + s, device=ids.device)
        with self.clock.span(f"forward_{self.name}"):
            out = self.decoder(
                input_ids=ids,
                position_ids=pos.unsqueeze(0).expand(ids.shape[0], -1),
                use_cache=True,
                **{self._kw: self.cache},
            )
            hidden = out.last_hidden_state
            logits = self.head(hidden)
        self.cache_len += s
        self.forward_calls += 1
        return hidden, logits

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions (no-op when the cache is already that short)."""
        if length < self.cache_len:
            _drop(self.cache, self.cache_len - length)
            self.cache_len = length
