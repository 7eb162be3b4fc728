"""Turning logits into the distributions that tokens are drawn from.

Both models go through the same `Sampler`, so the draft's proposal q and the target's p are
defined by the same temperature and top-p. "Sampling space" logits are raw logits divided by
the temperature (left as they are when greedy); DRIFT adds its bias in that space.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


NUCLEUS_CANDIDATES = 64   # the top-p filter's first guess at the nucleus size
NUCLEUS_BINS = 256        # logit bins of the second guess, spanning NUCLEUS_SPAN below the top logit
NUCLEUS_SPAN = 32.0
NUCLEUS_MARGIN = 1e-3     # mass the second guess holds beyond top_p (float32 cumsum rounding)
NUCLEUS_SORT_FRACTION = 0.85  # a second guess above this share of V sorts instead (a top-k that wide costs a sort)
NUCLEUS_FLAT_SHARE = 4        # a row that provably needs more than V / this beyond the first guess is sorted
NUCLEUS_COUNT_VOCAB = 32768   # below this vocabulary a full sort costs no more than the counting pass's small ops


def _ranked(logits: torch.Tensor, log_z: torch.Tensor, k: int):
    """(ranked [..., k], order [..., k], mass ranked before each) of the top k logits (k = V: a full sort)."""
    v = logits.shape[-1]
    ranked, order = torch.topk(logits, k, dim=-1) if k < v else torch.sort(logits, dim=-1, descending=True)
    p = (ranked - log_z).exp()
    return ranked, order, p.cumsum(dim=-1) - p


def _holds(before: torch.Tensor, top_p: float) -> bool:
    """Whether candidates hold the nucleus: the mass before the last one already reaches top_p."""
    return bool((before[..., -1] >= top_p).all())


def _second_guess(logits: torch.Tensor, log_z: torch.Tensor, first: torch.Tensor, top_p: float) -> int:
    """A candidate count that holds the nucleus of every row, from one counting pass (V: sort).

    `first` [..., k] are the first guess's ranked logits. Every token after them is at most as
    likely as the last, so a row still needs at least (top_p - their mass) / (its probability)
    more tokens; when that bound is already over V / NUCLEUS_FLAT_SHARE the row is flat and the
    nucleus most likely more than NUCLEUS_SORT_FRACTION of V: sort without counting. Otherwise each
    row's logits are counted, with their probabilities, in NUCLEUS_BINS bins below its top logit;
    the bins are monotone in the logit, so the tokens of the first j bins are exactly the
    top-(their count) tokens. The count through the first bin whose cumulative mass reaches
    top_p + NUCLEUS_MARGIN, plus one (so the mass before the last candidate reaches top_p), is
    the guess.
    """
    v = logits.shape[-1]
    p_first = (first - log_z).exp()
    needed = (top_p - p_first.sum(dim=-1)) / p_first[..., -1]
    if float(needed.max()) > v / NUCLEUS_FLAT_SHARE:
        return v
    rows = logits.reshape(-1, v)
    n = rows.shape[0]
    top = first[..., :1]
    scale = NUCLEUS_BINS / NUCLEUS_SPAN
    bins = torch.sub(top.reshape(-1, 1) * scale, rows, alpha=scale).clamp_(0, NUCLEUS_BINS - 1).to(torch.int32)
    if n > 1:
        bins += torch.arange(n, dtype=torch.int32)[:, None] * NUCLEUS_BINS
    bins = bins.flatten()
    p = (rows - log_z.reshape(-1, 1)).exp_().flatten()
    mass = torch.bincount(bins, weights=p, minlength=n * NUCLEUS_BINS).view(n, NUCLEUS_BINS)[:, :-1]
    count = torch.bincount(bins, minlength=n * NUCLEUS_BINS).view(n, NUCLEUS_BINS)[:, :-1]
    enough = mass.cumsum(-1) >= top_p + NUCLEUS_MARGIN          # the last, open-ended bin is no bound
    if not bool(enough.any(dim=-1).all()):
        return v
    reached = enough.int().argmax(dim=-1, keepdim=True)         # each row's first bin that reaches it
    return min(v, int(count.cumsum(-1).gather(-1, reached).max()) + 1)


def nucleus(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of logits [..., V] (sampling space) as ranked candidates.

    Returns (ranked [..., k] logits, best first, -inf where a candidate is outside the nucleus;
    order [..., k] their token ids). A token is in the nucleus when the probability of the tokens
    ranked before it is below top_p, so the most likely token always is.

    On the CPU the top `NUCLEUS_CANDIDATES` logits are ranked first (a partial sort). They
    provably hold the nucleus when the mass before the last candidate already reaches top_p.
    Otherwise one counting pass bounds the nucleus size (`_second_guess`); a bound up to
    NUCLEUS_SORT_FRACTION of V is ranked by a second top-k, a larger one (a flat row) by the full
    sort, which is also the fallback should the second guess not hold. So the worst case is the
    first guess, the counting pass and one full sort. Probabilities are normalised over the full
    vocabulary either way, so the nucleus is the one a full sort gives. On CUDA the full sort is
    used: the size checks would synchronise the device at every draft token.
    """
    v = logits.shape[-1]
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    k = v if logits.is_cuda else min(v, NUCLEUS_CANDIDATES)
    ranked, order, before = _ranked(logits, log_z, k)
    if k < v and not _holds(before, top_p):
        k = _second_guess(logits, log_z, ranked, top_p) if v >= NUCLEUS_COUNT_VOCAB else v
        if k <= v * NUCLEUS_SORT_FRACTION:
            ranked, order, before = _ranked(logits, log_z, k)
        if k > v * NUCLEUS_SORT_FRACTION or not _holds(before, top_p):
            ranked, order, before = _ranked(logits, log_z, v)
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
