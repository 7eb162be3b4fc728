"""Changed targets for target-change streams: the same target re-quantised or briefly fine-tuned.

A change is a recipe string (`--switch-target`):
  bf16            every weight rounded to bfloat16 (stored in fp32: the model runs as before)
  int8            every linear layer's weight fake-quantised to int8, symmetric per output channel
                  (torch's dynamic int8 quantisation of the weights; stored dequantised)
  finetune:DOMAIN 24 AdamW steps (batch 4 x 64 tokens, lr 1e-4) of next-token loss on DOMAIN's
                  train split (a scenario name), through `zoo.training.run_steps`

Each is built once and cached by recipe under the zoo cache (`targets/<kind>-<hash>`), keyed by
the base target's fingerprint and the recipe, and written atomically. The result is a Hugging
Face checkpoint directory with the base target's tokenizer, so `--target PATH` (and `drift
regress check --target PATH`) take it like any other target.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from drift_cli.errors import BadInput
from drift_cli.zoo import cache
from drift_cli.zoo.training import Progress

KINDS = ("bf16", "int8", "finetune")
FINETUNE = {"steps": 24, "batch": 4, "seq_len": 64, "lr": 1e-4, "warmup": 4, "seed": 0}


@dataclass(frozen=True)
class TargetChange:
    kind: str                 # bf16 | int8 | finetune
    domain: str | None = None  # finetune: the scenario whose train split it is tuned on
    steps: int = FINETUNE["steps"]

    @classmethod
    def parse(cls, text: str) -> "TargetChange":
        """'bf16', 'int8' or 'finetune:DOMAIN' (BadInput otherwise)."""
        kind, _, domain = text.strip().partition(":")
        if kind not in KINDS:
            from drift_cli.registry import unknown

            raise unknown("target change", kind, KINDS)
        if (kind == "finetune") != bool(domain):
            raise BadInput(f"--switch-target {text!r}: finetune takes a domain (finetune:code); bf16 and int8 none")
        if kind == "finetune":
            from drift_cli.scenarios import load_scenario

            load_scenario(domain)          # an unknown domain fails here, before any model loads
        return cls(kind, domain or None)

    @property
    def label(self) -> str:
        return self.kind if self.domain is None else f"{self.kind}:{self.domain}"

    def recipe(self, base_fingerprint: str) -> dict:
        r = {"component": "changed-target", "code_version": cache.CODE_VERSION, "base": base_fingerprint,
             "kind": self.kind}
        if self.kind == "finetune":
            r |= {"domain": self.domain, **FINETUNE, "steps": self.steps}
        return cache.seal(r)


@torch.no_grad()
def round_to_bf16(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def fake_quantise_int8(model: torch.nn.Module) -> None:
    """Every nn.Linear weight [out, in] -> round(w / s) * s with s = max|w_row| / 127 per row."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            w = m.weight
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            w.copy_((w / scale).round().clamp(-127, 127) * scale)


def finetune(model: torch.nn.Module, tokenizer, change: TargetChange, progress: Progress | None) -> list:
    """A few AdamW steps of next-token loss on the domain's train split; returns the loss curve."""
    from drift_cli.scenarios import documents
    from drift_cli.zoo.tokenizer import encode_documents
    from drift_cli.zoo.training import DomainSampler, next_token_loss, run_steps, windows

    docs = documents(change.domain, "train")
    rows = windows(encode_documents(tokenizer, [d.text for d in docs]), FINETUNE["seq_len"] + 1)
    sampler = DomainSampler([rows], FINETUNE["batch"], FINETUNE["seed"])
    model.requires_grad_(True)
    curve = run_steps(model, lambda step: next_token_loss(model, sampler.batch_at(step)), change.steps,
                      FINETUNE["lr"], FINETUNE["warmup"], 0.0, 0.1, f"target {change.label}", progress)
    model.requires_grad_(False)
    return curve


def ensure_changed_target(base: str | Path, change: TargetChange, progress: Progress | None = None) -> Path:
    """The changed target's checkpoint directory (built once per base target and recipe)."""
    from drift_cli.models import load_tokenizer, resolve_checkpoint
    from drift_cli.zoo.build import load_model
    from drift_cli.zoo.training import cpu_threads

    directory, base_print = resolve_checkpoint(base, "target")
    recipe = change.recipe(base_print)
    final = cache.cache_root() / "targets" / f"{change.kind}-{recipe['hash'][:16]}"
    if cache.component_matches(final, recipe["hash"]):
        return final
    with cache.build_lock("changed-target"), cpu_threads():
        if cache.component_matches(final, recipe["hash"]):
            return final
        with cache.atomic_directory(final) as tmp:
            start = time.perf_counter()
            model, tokenizer = load_model(directory), load_tokenizer(directory, "target")
            info: dict = {"change": change.label, "base": str(base), "base_fingerprint": base_print}
            if change.kind == "bf16":
                round_to_bf16(model)
            elif change.kind == "int8":
                fake_quantise_int8(model)
            else:
                info["loss_curve"] = finetune(model, tokenizer, change, progress)
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            info["wall_time_s"] = round(time.perf_counter() - start, 2)
            cache.write_json_atomic(tmp / "build.json", info | {"recipe": asdict(change)})
            cache.write_json_atomic(tmp / "recipe.json", recipe)
    return final
