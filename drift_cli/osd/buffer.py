"""The replay buffer: (context, target distribution) pairs taken from verification feedback.

Alignment. The draft's prediction for token x_t is made from the context x_0..x_{t-1}: its
logits at the *last* context position. A buffered position therefore stores the context that
ends just before the drafted token (committed ids plus the drafted tokens before it) and the
target's distribution for that same token, `Feedback.target_logits[:, j]` for drafted slot j.
The trainer reads the draft's logits at `ids[-1]`, which are exactly the logits that proposed
the token (the public OSD LLaMA path reads them one position later; we do not).

The target is never re-run: its distribution is copied out of the verification pass, kept as
its top-K log-probabilities (renormalised over the support at training time) or in full. For an
EAGLE head an entry also holds the target's states over its context (positions 0..L-2, the pairs
that precede the token), as the drafter hands them out: views of its per-row history where the
commit holds them (no copy), verification's for drafted positions past the accepted ones.
When an update trains a draft model's output head alone (`--osd-train head`), an entry also keeps
the draft's hidden state at that position (the head's input, `Proposal.hidden`): the layers below
the head do not change, so the trainer reads it instead of running the draft over the context.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:  # a runtime import would cycle: drift_cli.methods imports the osd method
    from drift_cli.engine.policy import Feedback


@dataclass
class BufferEntry:
    ids: torch.Tensor                 # [L] int64: the context whose last position predicts the token
    logprobs: torch.Tensor            # [K] (top-K) or [V] (full) fp32 target log-probs at the decode temperature
    support: torch.Tensor | None      # [K] int64 token ids of the top-K support; None = full distribution
    features: torch.Tensor | None = None   # [L-1, F] an EAGLE head's: the target's states over the context
    hidden: torch.Tensor | None = None     # [d] a draft model's head input at the context's last position
    #                                        (kept only when the layers below its head are frozen)

    @property
    def nbytes(self) -> int:
        """Bytes of its own (target states are views of shared storage: `ReplayBuffer.nbytes` counts them)."""
        extra = sum(t.nbytes for t in (self.support, self.hidden) if t is not None)
        return self.ids.nbytes + self.logprobs.nbytes + extra


def buffered_slots(accepted: int, k: int, all_positions: bool) -> range:
    """Drafted slots j (0-based) to buffer: the rejected one (slot `accepted`, if any), or all k."""
    if all_positions:
        return range(k)
    return range(accepted, accepted + 1) if accepted < k else range(0)


def target_temperature(feedback: Feedback) -> float:
    """Distributions are matched at the decode temperature (T = 1 for greedy decoding)."""
    return 1.0 if feedback.sampler.greedy else feedback.sampler.temperature


@torch.no_grad()
def entries_from_feedback(feedback: Feedback, topk: int, all_positions: bool,
                          features: Callable[[int, int], torch.Tensor] | None = None,
                          keep_hidden: bool = False) -> list[BufferEntry]:
    """The buffer entries one verification step yields. Copies (clones) everything it keeps:
    the feedback's tensors come out of inference mode and the engine reuses nothing of ours.
    features (an EAGLE head's): (row b, drafted slot j) -> the target's states over that context
    (kept as given: the trainer copies them into its batch). keep_hidden: each entry also keeps
    the proposal's hidden state at its position (a draft model whose head alone trains)."""
    prop = feedback.proposal
    keep_hidden = keep_hidden and prop.hidden is not None
    temp = target_temperature(feedback)
    out: list[BufferEntry] = []
    lengths = prop.lengths                        # ragged rows: row b drafted lengths[b] <= k
    for b in range(prop.tokens.shape[0]):
        for j in buffered_slots(int(feedback.accepted[b]), lengths[b], all_positions):
            ids = torch.cat([feedback.context[b], prop.tokens[b, :j]]).clone()     # [L + j]
            logp = torch.log_softmax(feedback.target_logits[b, j].float() / temp, dim=-1)  # [V]
            states = None if features is None else features(b, j)
            hidden = prop.hidden[b, j].clone() if keep_hidden else None
            if 0 < topk < logp.shape[-1]:
                vals, idx = logp.topk(topk)
                out.append(BufferEntry(ids, vals.clone(), idx.clone(), states, hidden))
            else:
                out.append(BufferEntry(ids, logp.clone(), None, states, hidden))
    return out


def dense_target(entries: list[BufferEntry], vocab: int) -> torch.Tensor:
    """[N, V] target log-probs; a top-K entry is renormalised over its support (-inf elsewhere)."""
    rows = []
    for e in entries:
        if e.support is None:
            rows.append(e.logprobs)
            continue
        row = torch.full((vocab,), float("-inf"), dtype=e.logprobs.dtype, device=e.logprobs.device)
        rows.append(row.scatter(0, e.support, e.logprobs - torch.logsumexp(e.logprobs, 0)))
    return torch.stack(rows)


class ReplayBuffer:
    """Bounded FIFO of buffer entries; uniform sampling without replacement.

    `seen` counts the verification steps whose feedback the buffer has taken (set by the policy
    with each `extend`). A background worker reads it through `snapshot` (under the lock the
    decoder's `extend` takes), so a snapshot's entries and its `seen` belong together."""

    def __init__(self, capacity: int) -> None:
        self.entries: deque[BufferEntry] = deque(maxlen=capacity)
        self.added = 0
        self.seen = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def extend(self, entries: list[BufferEntry], seen: int | None = None) -> None:
        with self.lock:
            self.entries.extend(entries)
            self.added += len(entries)
            if seen is not None:
                self.seen = seen

    def snapshot(self) -> "ReplayBuffer":
        """A copy holding the same entries (shared, never written) and the same `seen`: what a
        background update samples from while the decoder keeps extending this one."""
        copy = ReplayBuffer(self.entries.maxlen or 1)
        with self.lock:
            copy.entries.extend(self.entries)
            copy.added, copy.seen = self.added, self.seen
        return copy

    def sample(self, n: int, generator: torch.Generator) -> list[BufferEntry]:
        picks = torch.randperm(len(self.entries), generator=generator)[:n].tolist()
        return [self.entries[i] for i in picks]

    @property
    def nbytes(self) -> int:
        """The entries' own bytes plus each distinct storage of target states they hold once."""
        storages = {e.features.untyped_storage().data_ptr(): e.features.untyped_storage().nbytes()
                    for e in self.entries if e.features is not None}
        return sum(e.nbytes for e in self.entries) + sum(storages.values())
