"""The method interface: a draft policy plugged into the one engine loop.

A method differs from another only in how it drafts and what it does with verification
feedback. The engine (`drift_cli.engine.loop`) owns the target, the acceptance rule and the
timing; a policy owns its drafter (a draft LM, an n-gram table, nothing at all for `ar`).

Per iteration the engine calls, in order:
    propose(context, gamma, sampler) -> Proposal    # timed as "draft"
    (target verifies; exact acceptance)             # timed as "verify"
    commit(new_context)                             # roll caches back to the accepted prefix
    observe(feedback)                               # timed as "adapt"
Per prompt: begin_prompt / end_prompt; per stream: begin_stream / end_stream. Tensors keep a batch
dimension B (the engine runs B = 1 today).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

import torch

from drift_cli.engine.lm import CausalLM
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.timing import IterationClock, NullClock


@dataclass
class Proposal:
    tokens: torch.Tensor                     # [B, k] int64; k may be 0 (nothing drafted)
    q: torch.Tensor | None = None            # [B, k, V] the distribution each token was drawn from
    #                                          (after any adjustment); None when greedy or when the
    #                                          proposal is a point mass (model-free drafters)
    hidden: torch.Tensor | None = None       # [B, k, d] draft hidden state (lm_head input) per position
    base_logits: torch.Tensor | None = None  # [B, k, V] raw draft logits before any adjustment
    top_prob: torch.Tensor | None = None     # [B, k] the top probability of each position's q' (only
    #                                          when a `confidence` γ controller asked for it)

    @property
    def k(self) -> int:
        return self.tokens.shape[1]

    def truncate(self, k: int) -> "Proposal":
        cut = lambda t: None if t is None else t[:, :k]  # noqa: E731
        return Proposal(self.tokens[:, :k], cut(self.q), cut(self.hidden), cut(self.base_logits), cut(self.top_prob))


@dataclass
class Feedback:
    """What verification revealed, at every drafted position (accepted or not)."""

    context: torch.Tensor        # [B, L] committed ids before this iteration (prompt + output so far)
    proposal: Proposal
    target_logits: torch.Tensor  # [B, k+1, V] raw target logits for positions [last, x1..xk]
    accepted: torch.Tensor       # [B] int64: accepted draft tokens
    next_token: torch.Tensor     # [B] int64: the correction (or bonus) token
    sampler: Sampler
    step: int                    # verification step index within the stream
    target_hidden: torch.Tensor | None = None  # [B, k+1, d_target] the target's lm_head inputs


S = TypeVar("S")


@dataclass
class MethodContext:
    """Everything a method may need to build itself."""

    draft: torch.nn.Module | None            # the (shared, frozen) draft model; copy it before training it
    draft_path: Path | None
    draft_fingerprint: str | None
    eos_id: int | None
    vocab_size: int
    # the methods' settings (`DraftPolicy.configs` classes) by class; a class absent here means its defaults
    configs: dict[type, Any] = field(default_factory=dict)
    scenario: str = ""
    seed: int = 0
    # Returns the path of a cached offline draft for (scenario, divergence); set by the bench.
    resolve_offline: Callable[[str], Path] | None = None
    load_draft: Callable[[Path], torch.nn.Module] | None = None

    def config(self, cls: type[S]) -> S:
        """The settings instance of this class (its defaults when none was given), validated."""
        return self.configs.get(cls) or cls()

    @classmethod
    def settings_from_options(cls, options: dict[str, Any], classes: list[type]) -> dict[type, Any]:
        """Parsed CLI option values -> {settings class: instance}, each validated (BadInput)."""
        return {c: c.from_options(options).validate() for c in classes}


class DraftPolicy:
    """Base class. Subclasses set `name`, and override what they need."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    uses_draft_model: ClassVar[bool] = False
    drafts: ClassVar[bool] = True        # False (`ar`): the γ controller does not apply
    # The method's settings dataclasses (fields made with `drift_cli.knobs.knob`): `drift bench`,
    # `ablate` and `analyze` generate their flags from these (`drift_cli.commands.options`).
    configs: ClassVar[tuple[type, ...]] = ()

    clock: IterationClock = NullClock()
    # Set by the engine for the `confidence` γ controller: a drafter that can stop early stops
    # before the first position whose proposal's top probability is below this.
    p_min: float | None = None

    @classmethod
    def build(cls, ctx: MethodContext) -> "DraftPolicy":
        return cls()

    def begin_stream(self) -> None:
        """Reset adaptive state: called once before the first prompt of a stream."""

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        """prompt: [B, P]. Prefill caches, switch tenant."""

    def propose(self, context: torch.Tensor, gamma: int, sampler: Sampler) -> Proposal:
        """Draft up to gamma tokens after context [B, L]."""
        return Proposal(tokens=context.new_empty((context.shape[0], 0)))

    def commit(self, context: torch.Tensor) -> None:
        """The committed sequence [B, L'] after verification: roll caches back to it."""

    def observe(self, feedback: Feedback) -> None:
        """Learn from verification (timed as adaptation)."""

    def end_prompt(self, output: torch.Tensor) -> None:
        """output: [B, n] the ids generated for the prompt."""

    def end_stream(self) -> None:
        """After the last prompt of a stream (also after an interrupt): persist state, if any."""

    def report(self) -> dict[str, Any]:
        """Method-specific figures for run.json (memory, bank statistics, ...)."""
        return {}


class ModelDraftPolicy(DraftPolicy):
    """Drafting with a draft LM: γ autoregressive steps from its KV cache.

    Subclasses change the proposal through `adjust` (sampling-space logits) and learn in `observe`.
    Cache invariant: the draft cache holds a prefix of the committed sequence minus its last
    token; `propose` feeds whatever committed tokens the cache lacks (1, or 2 after a bonus).
    """

    uses_draft_model = True

    def __init__(self, draft: torch.nn.Module) -> None:
        self.lm = CausalLM(draft, name="draft")

    @classmethod
    def build(cls, ctx: MethodContext) -> "DraftPolicy":
        assert ctx.draft is not None, f"method {cls.name} needs a draft model"
        return cls(ctx.draft)

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        self.lm.reset()
        self.lm.clock = self.clock
        if prompt.shape[1] > 1:
            self.lm.forward(prompt[:, :-1])

    def adjust(self, hidden: torch.Tensor, logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
        """hidden [B, d], sampling-space logits [B, V] -> the logits to draw from. Identity here."""
        return logits

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampler: Sampler) -> Proposal:
        feed = context[:, self.lm.cache_len:]
        tokens, qs, hs, zs, tops = [], [], [], [], []
        for _ in range(gamma):
            h, z = self.lm.forward(feed)
            h, z = h[:, -1], z[:, -1]                      # [B, d], [B, V]
            logits = sampler.sampling_logits(z)            # the engine's conversion, untimed
            with self.clock.span("adjust"):                # the method's own adjustment only
                logits = self.adjust(h, logits, sampler)
            if self.p_min is not None:
                # the stop depends only on the draft's own distribution here, before a token is
                # drawn, so sampling stays exact; one host read per draft token (llama.cpp's p-min)
                top = sampler.probs(logits).amax(dim=-1)   # [B]; greedy: the T = 1 distribution
                if float(top.min()) < self.p_min:
                    break
                tops.append(top)
            x, q = sampler.pick(logits)
            tokens.append(x)
            hs.append(h)
            zs.append(z)
            if q is not None:
                qs.append(q)
            feed = x[:, None]
        if not tokens:
            return DraftPolicy.propose(self, context, gamma, sampler)
        return Proposal(
            tokens=torch.stack(tokens, 1),
            q=torch.stack(qs, 1) if qs else None,
            hidden=torch.stack(hs, 1),
            base_logits=torch.stack(zs, 1),
            top_prob=torch.stack(tops, 1) if tops else None,
        )

    def commit(self, context: torch.Tensor) -> None:
        self.lm.crop(context.shape[1] - 1)
