"""The OSD update: a few AdamW steps on the draft copy over batches sampled from the buffer.

Packing. Buffered contexts from one prompt are prefixes of each other (the rejected position's
context is a prefix of the committed sequence), so a batch packs every context that is a prefix
of a longer one into that one's row: one forward pass per distinct sequence, right-padded (the
causal mask keeps padding out of every position that is read). Positions start at 0 as in the
engine's KV-cached forward. Only the read positions go through `lm_head`. An EAGLE head reads
the target's states too: each packed row takes its longest entry's ([S-1, F], copied into the
batch), and the head runs teacher forced on them (`EagleHead.teacher_forced`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from drift_cli.divergence import divergence
from drift_cli.engine.head import head_logits
from drift_cli.osd.buffer import BufferEntry, ReplayBuffer, dense_target
from drift_cli.osd.config import OSDConfig


@dataclass
class PackedBatch:
    ids: torch.Tensor   # [R, S] int64, right-padded with 0; R distinct sequences
    row: torch.Tensor   # [N] int64: the row holding entry i's context
    col: torch.Tensor   # [N] int64: the last position of entry i's context (its logits predict the token)
    features: torch.Tensor | None = None   # [R, S-1, F] an EAGLE head's target states (zeros past a row)


def pack(entries: list[BufferEntry]) -> PackedBatch:
    order = sorted(range(len(entries)), key=lambda i: -entries[i].ids.shape[0])
    seqs: list[torch.Tensor] = []
    row = [0] * len(entries)
    for i in order:
        ids = entries[i].ids
        n = ids.shape[0]
        r = next((r for r, s in enumerate(seqs) if torch.equal(s[:n], ids)), None)
        if r is None:
            seqs.append(ids)
            r = len(seqs) - 1
        row[i] = r
    width = seqs[0].shape[0]
    padded = torch.zeros(len(seqs), width, dtype=torch.long, device=seqs[0].device)
    for r, s in enumerate(seqs):
        padded[r, : s.shape[0]] = s
    col = [e.ids.shape[0] - 1 for e in entries]
    dev = padded.device
    features = None
    if entries[0].features is not None:           # each row's states: those of its longest entry
        longest = {}
        for i in order:
            longest.setdefault(row[i], entries[i].features)
        features = torch.zeros(len(seqs), max(1, width - 1), longest[0].shape[-1], dtype=longest[0].dtype, device=dev)
        for r, f in longest.items():
            features[r, :f.shape[0]] = f
    return PackedBatch(padded, torch.tensor(row, device=dev), torch.tensor(col, device=dev), features)


def logits_at(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The model's raw logits [N, V] (fp32) at each entry's last context position, with gradients.
    A head's: at the pair before it (state at L-2, token L-1), which predicts the next token."""
    if batch.features is not None:
        hidden = model.teacher_forced(batch.ids, batch.features)                   # [R, S-1, d]
        return head_logits(model, hidden[batch.row, batch.col - 1])
    s = batch.ids.shape[1]
    pos = torch.arange(s, device=batch.ids.device).unsqueeze(0).expand(batch.ids.shape[0], -1)
    hidden = model.get_decoder()(input_ids=batch.ids, position_ids=pos, use_cache=False).last_hidden_state
    return head_logits(model, hidden[batch.row, batch.col])                      # [N, d] -> [N, V]


def batch_loss(model: torch.nn.Module, entries: list[BufferEntry], kind: str, temperature: float) -> torch.Tensor:
    """divergence(target p, draft q) averaged over the entries, both at the decode temperature.
    Entries that kept the head's input (the head alone trains) skip the draft's forward."""
    if all(e.hidden is not None for e in entries):
        logits = head_logits(model, torch.stack([e.hidden for e in entries])) / temperature
    else:
        logits = logits_at(model, pack(entries)) / temperature                      # [N, V]
    return divergence(kind, dense_target(entries, logits.shape[-1]), logits)


@dataclass
class UpdateStats:
    updates: int = 0
    train_ms: list[float] = field(default_factory=list)     # per update: the AdamW steps
    rebuild_ms: list[float] = field(default_factory=list)   # per update: the draft KV re-prefill
    loss: list[float] = field(default_factory=list)         # per update: mean loss over its steps (before each step)
    grad_norm: list[float] = field(default_factory=list)    # per update: mean pre-clip gradient norm
    gradient_bytes: int = 0                                 # gradient buffers alive during an update
    # the draft each proposal drew from: verification steps since the newest feedback its weights saw
    staleness: list[int] = field(default_factory=list)      # per proposal
    swaps: int = 0                                          # background: finished weights swapped in
    swap_ms: list[float] = field(default_factory=list)      # background, per swap: the copy (decode path)


class DraftTrainer:
    """AdamW on every parameter of the (private) draft copy."""

    def __init__(self, model: torch.nn.Module, cfg: OSDConfig) -> None:
        self.model, self.cfg = model, cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def update(self, buffer: ReplayBuffer, temperature: float, generator: torch.Generator,
               go_on: Callable[[int], bool] | None = None) -> tuple[float, float, int]:
        """cfg.steps AdamW steps; returns (mean loss, mean pre-clip grad norm, gradient bytes).
        go_on(i), after step i: False ends the update there (a background worker told to stop)."""
        losses, norms, grad_bytes = [], [], 0
        for i in range(self.cfg.steps):
            entries = buffer.sample(self.cfg.batch, generator)
            loss = batch_loss(self.model, entries, self.cfg.divergence, temperature)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            max_norm = self.cfg.clip if self.cfg.clip > 0 else float("inf")
            norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, max_norm)))
            grad_bytes = max(grad_bytes, sum(p.grad.nbytes for p in self.params if p.grad is not None))
            self.optimizer.step()
            losses.append(float(loss.detach()))
            if go_on is not None and not go_on(i):
                break
        self.optimizer.zero_grad(set_to_none=True)   # gradients live only during an update
        return sum(losses) / len(losses), sum(norms) / len(norms), grad_bytes

    def state_bytes(self) -> int:
        """Optimizer state actually allocated (AdamW: exp_avg + exp_avg_sq per parameter, + step)."""
        return sum(t.nbytes for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t))


def now_ms(device: torch.device) -> float:
    """Wall clock after a device sync (updates are rare; their cost must be measured whole)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3
