"""Where a greedy output left `ar`'s, and how close the target's choice was there.

Greedy speculative decoding reproduces `ar` exactly in exact arithmetic. In floating point a
batched matmul, or bf16 on a GPU, can reorder sums, and at a near-tie of the target's top two
logits that flips the argmax. For an output that differs from `ar`'s this records the first
diverging position and the target's top-2 logit gap there (one fresh target pass over the
prompt and `ar`'s tokens before it): a gap near 0 is a float near-tie; a large gap is a bug.
"""

from __future__ import annotations

import torch

MAX_RECORDED = 20   # diverging prompts recorded per method


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_gap(model: torch.nn.Module, ids: list[int]) -> float | None:
    """The target's top-1 minus top-2 logit after ids (None for a one-token vocabulary)."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device)).logits[0, -1].float()
    if logits.shape[-1] < 2:
        return None
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def divergences(target: torch.nn.Module, generations, ar_generations) -> list[dict]:
    """Per prompt whose output differs from `ar`'s: the position, both tokens and the top-2 gap."""
    out = []
    for g, a in zip(generations, ar_generations, strict=True):
        i = first_difference(g.output_ids, a.output_ids)
        if i is None:
            continue
        if len(out) == MAX_RECORDED:
            break
        token = lambda ids: ids[i] if i < len(ids) else None  # noqa: E731
        out.append({"prompt": g.prompt_index, "position": i, "ar_token": token(a.output_ids),
                    "token": token(g.output_ids),
                    "top2_gap": top2_gap(target, list(a.prompt_ids) + a.output_ids[:i])})
    return out
