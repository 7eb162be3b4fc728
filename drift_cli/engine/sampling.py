"""Turning logits into the distributions that tokens are drawn from.

Both models go through the same `Sampler`, so the draft's proposal q and the target's p are
defined by the same temperature and top-p. "Sampling space" logits are raw logits divided by
the temperature (left as they are when greedy); DRIFT adds its bias in that space.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def top_p_filter(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Mask to -inf every token outside the smallest set whose probability reaches top_p.

    logits: [..., V] in sampling space. The most likely token is always kept.
    """
    if top_p is None or top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p  # mass before this token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@dataclass
class Sampler:
    """Greedy when temperature == 0, else temperature (and optional top-p) sampling."""

    temperature: float = 0.0
    top_p: float | None = None
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Raw logits [..., V] -> sampling-space logits (divided by T; unchanged when greedy)."""
        return logits.float() if self.greedy else logits.float() / self.temperature

    def probs(self, sampling_logits: torch.Tensor) -> torch.Tensor:
        """Sampling-space logits [..., V] -> the distribution tokens are drawn from."""
        return torch.softmax(top_p_filter(sampling_logits, self.top_p), dim=-1)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of probs [B, V] -> [B] int64."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def pick(self, sampling_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Choose tokens from sampling-space logits [B, V]: (tokens [B], probs [B, V] or None when greedy)."""
        if self.greedy:
            return sampling_logits.argmax(dim=-1), None
        probs = self.probs(sampling_logits)
        return self.draw(probs), probs
