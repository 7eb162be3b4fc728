"""The output head: hidden states -> logits over the whole vocabulary, or over a draft's subset.

A draft may declare a vocabulary subset (FR-Spec; EAGLE-3 drafts over 32k of 128k tokens): its
config carries `draft_vocab_ids`, the token ids its head scores. Only those rows of the output
matrix are multiplied, which makes the head of a 49k-vocabulary draft several times cheaper;
every other token gets the logit `OUTSIDE`. In float32, exp(OUTSIDE - max) is exactly 0, so such
a token has probability 0 under the draft: it is never proposed and the acceptance rule stays
exact (a token with q = 0 is only ever emitted from the target's residual or bonus
distribution). The logit stays finite so that log q is finite wherever DRIFT or a divergence
reads it.

The engine, offline distillation and OSD all go through `head_logits`, so one draft has one
distribution everywhere.
"""

from __future__ import annotations

import torch

from drift_cli.engine import cpu_linear

VOCAB_SUBSET_KEY = "draft_vocab_ids"
OUTSIDE = -1.0e4


def vocab_subset(model: torch.nn.Module) -> list[int] | None:
    ids = getattr(model.config, VOCAB_SUBSET_KEY, None)
    return list(ids) if ids else None


class OutputHead:
    """hidden [..., d] -> logits [..., V] (fp32) for one model, full or over its subset.

    The subset's rows are gathered once and gathered again only when the weights change in
    place (OSD's optimiser steps bump the tensor's version counter). A *compact* head holds only
    the subset's rows, in the order of `draft_vocab_ids` (`compact_head`; the layout of EAGLE-3's
    reduced-vocabulary heads): its weight is used as it is, and the vocabulary size is the config's.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.linear = model.get_output_embeddings()
        ids = vocab_subset(model)
        rows = self.linear.weight.shape[0]
        self.compact = ids is not None and rows == len(ids) and rows != model.config.vocab_size
        self.vocab_size = model.config.vocab_size if self.compact else rows
        self.ids = None if ids is None else torch.tensor(ids, dtype=torch.long, device=self.linear.weight.device)
        self._rows: torch.Tensor | None = None
        self._version = -1
        self._skinny = isinstance(self.linear, cpu_linear.SkinnyLinear)   # the subset's rows too

    @property
    def subset_size(self) -> int:
        return self.vocab_size if self.ids is None else int(self.ids.numel())

    def _subset_rows(self) -> torch.Tensor:
        w = self.linear.weight
        if self.compact:
            return w if torch.is_grad_enabled() and w.requires_grad else w.detach()
        if self._rows is None or self._version != w._version:
            self._rows = w.detach()[self.ids].contiguous()                     # [K, d]
            self._version = w._version
        return self._rows

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            return self.linear(hidden).float()
        if not self.compact and torch.is_grad_enabled() and self.linear.weight.requires_grad:
            rows = self.linear.weight[self.ids]                                # differentiable gather
        else:
            rows = self._subset_rows()
        sub = (cpu_linear.linear(hidden, rows) if self._skinny else hidden @ rows.T).float()   # [..., K]
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), OUTSIDE)
        return out.index_copy(-1, self.ids, sub)


def head_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """One-off logits (training code): the same distribution as the engine's `OutputHead`."""
    return OutputHead(model)(hidden)


def compact_head(model: torch.nn.Module) -> None:
    """Replace a subset draft's full output matrix by its subset's rows, in place (a [K, d] layer
    in place of [V, d]): the same logits, and a K-row parameter to train instead of V rows."""
    ids = vocab_subset(model)
    linear = model.get_output_embeddings()
    if ids is None or linear.weight.shape[0] == len(ids):
        return
    rows = linear.weight.detach()[torch.tensor(ids, device=linear.weight.device)].clone()
    small = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device, dtype=rows.dtype)
    with torch.no_grad():
        small.weight.copy_(rows)
    model.set_output_embeddings(small)
