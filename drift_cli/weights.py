"""Checks on the weights a command loads, shared by every loader (draft and target models, EAGLE
heads, offline drafts, the pairs `regress` pins): a leaf module that imports nothing of ours but
the errors."""

from __future__ import annotations

from typing import Iterable

import torch

from drift_cli.errors import BadInput


def refuse_non_finite(named: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    """BadInput naming the first floating-point tensor holding NaN or ±inf: a model whose weights
    are not numbers is refused when it loads, not found out by the run it would poison."""
    for name, t in named:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise BadInput(f"{where}: weight {name} holds non-finite values (NaN or inf)")
