"""Turning logits into the distributions that tokens are drawn from.

Both models go through the same `Sampler`, so the draft's proposal q and the target's p are
defined by the same temperature and top-p. "Sampling space" logits are raw logits divided by
the temperature (left as they are when greedy); DRIFT adds its bias in that space.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


NUCLEUS_CANDIDATES = 64   # the top-p filter's first guess at the nucleus size (grown x8 when short)


def nucleus(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of logits [..., V] (sampling space) as ranked candidates.

    Returns (ranked [..., k] logits, best first, -inf where a candidate is outside the nucleus;
    order [..., k] their token ids). A token is in the nucleus when the probability of the tokens
    ranked before it is below top_p, so the most likely token always is.

    On the CPU only the top `NUCLEUS_CANDIDATES` logits are ranked (a partial sort). They
    provably hold the nucleus when the mass before the last candidate already reaches top_p;
    otherwise the candidates grow x8 until that holds or they are the whole vocabulary.
    Probabilities are normalised over the full vocabulary either way, so the nucleus is the one a
    full sort gives. On CUDA the full sort is used: the size check would synchronise the device at
    every draft token.
    """
    v = logits.shape[-1]
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    k = v if logits.is_cuda else min(v, NUCLEUS_CANDIDATES)
    while True:
        ranked, order = torch.topk(logits, k, dim=-1) if k < v else torch.sort(logits, dim=-1, descending=True)
        p = (ranked - log_z).exp()
        before = p.cumsum(dim=-1) - p                                 # mass ranked before each candidate
        if k == v or bool((before[..., -1] >= top_p).all()):
            break
        k = min(v, k * 8)
    return ranked.masked_fill(before >= top_p, float("-inf")), order


def top_p_filter(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """logits [..., V] with every token outside the top-p nucleus masked to -inf."""
    if top_p is None or top_p >= 1.0:
        return logits
    ranked, order = nucleus(logits, top_p)
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ranked)


@dataclass
class Sampler:
    """Greedy when temperature == 0, else temperature (and optional top-p) sampling.

    With top-p, distributions are computed over the nucleus candidates and scattered into the
    vocabulary (zeros elsewhere), and a token is drawn among the candidates: the same
    distribution as a softmax over the masked vocabulary, without its full-width passes.
    """

    temperature: float = 0.0
    top_p: float | None = None
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def nucleus_sampling(self) -> bool:
        return self.top_p is not None and self.top_p < 1.0

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Raw logits [..., V] -> sampling-space logits (divided by T; unchanged when greedy)."""
        return logits.float() if self.greedy else logits.float() / self.temperature

    def _nucleus_probs(self, sampling_logits: torch.Tensor):
        """(candidate probs [..., k], candidate ids [..., k], probs [..., V])."""
        ranked, order = nucleus(sampling_logits, self.top_p)
        cand = torch.softmax(ranked, dim=-1)
        return cand, order, torch.zeros_like(sampling_logits).scatter(-1, order, cand)

    def probs(self, sampling_logits: torch.Tensor) -> torch.Tensor:
        """Sampling-space logits [..., V] -> the distribution tokens are drawn from."""
        if self.nucleus_sampling:
            return self._nucleus_probs(sampling_logits)[2]
        return torch.softmax(sampling_logits, dim=-1)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of probs [B, V] -> [B] int64."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def pick(self, sampling_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Choose tokens from sampling-space logits [B, V]: (tokens [B], probs [B, V] or None when greedy)."""
        if self.greedy:
            return sampling_logits.argmax(dim=-1), None
        if self.nucleus_sampling:
            cand, order, probs = self._nucleus_probs(sampling_logits)
            return order.gather(-1, self.draw(cand)[:, None]).squeeze(-1), probs
        probs = self.probs(sampling_logits)
        return self.draw(probs), probs
