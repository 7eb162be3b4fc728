"""The plain torch training loop shared by pre-training and distillation.

Data order is deterministic: token windows are grouped by domain, each domain's windows are
permuted once with the recipe seed, and batch slots cycle over domains round-robin, so every
domain gets an equal share of the updates whatever its size (the target must know all of them).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Progress = Callable[[str, float, float], None]
LOSS_POINTS = 50      # loss-curve resolution kept in the manifest


def training_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def cpu_threads(threads: int | None = None):
    """A deterministic build: `threads` intra-op threads (default `cache.build_threads()`, 1: on a
    shared 2-core machine one thread per process is also much faster than two oversubscribed
    ones) and torch's deterministic algorithms, so that one machine gives the same bytes whatever
    its load. Another CPU may still round differently: a pinned pair is files, not a recipe."""
    from drift_cli.zoo.cache import build_threads

    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads or build_threads())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


def autocast(device: torch.device, bf16: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def windows(token_rows: list[list[int]], length: int) -> torch.Tensor:
    """Concatenate rows and cut non-overlapping windows: [n, length] int64 (the tail is dropped)."""
    flat = torch.tensor([t for row in token_rows for t in row], dtype=torch.long)
    n = flat.numel() // length
    return flat[: n * length].view(n, length)


@dataclass
class DomainSampler:
    """Deterministic batches of windows drawn from domains with probability ~ n_windows**alpha
    (alpha = 1: natural proportions; 0: every domain equally often); each domain walks through
    its own seeded permutation and cycles when it runs out."""

    by_domain: list[torch.Tensor]   # per domain [n_d, L]
    batch: int
    seed: int
    alpha: float = 1.0

    def __post_init__(self) -> None:
        self.by_domain = [w for w in self.by_domain if w.shape[0] > 0]
        if not self.by_domain:
            raise ValueError("no training windows: the corpus is shorter than one sequence")
        g = torch.Generator().manual_seed(self.seed)
        self._orders = [torch.randperm(w.shape[0], generator=g) for w in self.by_domain]
        sizes = torch.tensor([float(w.shape[0]) for w in self.by_domain], dtype=torch.float64)
        self.weights = (sizes ** self.alpha / (sizes ** self.alpha).sum()).tolist()
        self._g = g
        self._slots: list[tuple[int, int]] = []   # (domain, k-th window of that domain) per batch slot
        self._counts = [0] * len(self.by_domain)

    def _draw_until(self, slots: int) -> None:
        while len(self._slots) < slots:      # fixed-size draws: the stream never depends on call order
            for d in torch.multinomial(torch.tensor(self.weights), 4096, replacement=True, generator=self._g).tolist():
                self._slots.append((d, self._counts[d]))
                self._counts[d] += 1

    def batch_at(self, step: int) -> torch.Tensor:
        """Batch `step` [B, L]: a pure function of (seed, step), in any order of asking."""
        self._draw_until((step + 1) * self.batch)
        rows = []
        for d, k in self._slots[step * self.batch:(step + 1) * self.batch]:
            order = self._orders[d]
            rows.append(self.by_domain[d][order[k % order.numel()]])
        return torch.stack(rows)


def lr_at(step: int, steps: int, lr: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_ratio * lr` at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup - 1)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def next_token_loss(model: torch.nn.Module, batch: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """Mean cross-entropy of predicting batch[:, 1:] from batch[:, :-1]; batch [B, L]."""
    with autocast(batch.device, bf16):
        logits = model(input_ids=batch[:, :-1]).logits      # [B, L-1, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def run_steps(
    model: torch.nn.Module,
    loss_at: Callable[[int], torch.Tensor],
    steps: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    min_lr_ratio: float,
    label: str,
    progress: Progress | None,
) -> list[list[float]]:
    """AdamW steps on `loss_at(step)`; returns the loss curve [[step, mean loss], ...]."""
    model.train()
    opt = adamw(model, lr, weight_decay)
    every = max(1, steps // LOSS_POINTS)
    curve, acc = [], 0.0
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup, min_lr_ratio)
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.item()
        if (step + 1) % every == 0 or step == steps - 1:
            n = (step % every) + 1
            curve.append([step + 1, round(acc / n, 5)])
            acc = 0.0
        if progress is not None:
            progress(label, step + 1, steps)
    model.eval()
    return curve
