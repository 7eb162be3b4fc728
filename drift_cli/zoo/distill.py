"""Offline distillation: the base draft fine-tuned on a scenario's train split from the target.

Off-policy batches are windows of the scenario's real train text; on-policy batches (when asked)
are a real prefix of `prefix_len` tokens continued by the draft itself for `new_tokens` tokens
(sampled at temperature 1), every other step, as in DistillSpec's mixture. Either way the target
labels every position with its full next-token distribution and the draft minimises
`divergence(kind, target, draft)` over all positions.
"""

from __future__ import annotations

import torch

from drift_cli.divergence import divergence
from drift_cli.engine.lm import CausalLM
from drift_cli.zoo.presets import DistillRecipe
from drift_cli.zoo.training import DomainSampler, Progress, autocast, run_steps


@torch.inference_mode()
def draft_continuations(draft: torch.nn.Module, prefix: torch.Tensor, new_tokens: int,
                        generator: torch.Generator) -> torch.Tensor:
    """prefix [B, P] -> [B, P + new_tokens]: the draft's own samples at temperature 1."""
    lm = CausalLM(draft, "draft")
    lm.reset()
    _, logits = lm.forward(prefix)
    out = [prefix]
    for _ in range(new_tokens):
        probs = torch.softmax(logits[:, -1], dim=-1)                      # [B, V]
        nxt = torch.multinomial(probs, 1, generator=generator)             # [B, 1]
        out.append(nxt)
        _, logits = lm.forward(nxt)
    draft.train()
    return torch.cat(out, dim=1)


def distill(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    sampler: DomainSampler,
    recipe: DistillRecipe,
    kind: str,
    on_policy: bool,
    label: str = "distil",
    progress: Progress | None = None,
    device: torch.device = torch.device("cpu"),
) -> list[list[float]]:
    """Train `draft` in place; returns the loss curve."""
    target.eval()
    generator = torch.Generator(device=device).manual_seed(recipe.seed)

    def loss_at(step: int) -> torch.Tensor:
        batch = sampler.batch_at(step).to(device)                            # [B, seq_len + 1]
        if on_policy and step % 2 == 1:
            prefix = batch[:, : recipe.prefix_len]
            batch = draft_continuations(draft, prefix, recipe.new_tokens, generator).clone()
        inputs = batch[:, :-1]
        with torch.no_grad(), autocast(device, recipe.bf16):
            target_logprobs = torch.log_softmax(target(input_ids=inputs).logits.float(), -1)   # [B, L, V]
        draft_logits = draft(input_ids=inputs).logits                        # [B, L, V]
        return divergence(kind, target_logprobs.flatten(0, 1), draft_logits.flatten(0, 1))

    return run_steps(draft, loss_at, recipe.steps, recipe.lr, recipe.warmup, 0.0, 0.1, label, progress)
