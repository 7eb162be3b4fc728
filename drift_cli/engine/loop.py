"""The one speculative decoding loop that every method runs through.

Per iteration (batch size 1; tensors keep the batch dimension):
  1. draft:  the policy proposes k <= gamma tokens (k = 0 for `ar`, or when pld finds no match)
  2. verify: the target scores [last, x1..xk] in one forward pass (k+1 distributions) and the
             exact acceptance rule picks the accepted prefix and the correction/bonus token
  3. roll back both KV caches to the committed sequence (crop, never re-prefill)
  4. adapt:  the policy observes the feedback
  5. a StepRecord with the time split draft / verify / adapt / other; on CUDA the clock syncs
     once, at the iteration boundary (the acceptance decision needs one host read anyway).

Cache invariant for the target: it holds the committed sequence minus its last token.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from drift_cli import interrupt
from drift_cli.engine.acceptance import accept_greedy, accept_sampling
from drift_cli.engine.gamma import CostProfile, GammaConfig, GammaController, controller as gamma_controller
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.timing import IterationClock
from drift_cli.methods.base import DraftPolicy, Feedback, Proposal
from drift_cli.stream import Stream


@dataclass
class DecodeConfig:
    gamma: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float | None = None
    eos_id: int | None = None
    seed: int = 0
    gamma_policy: GammaConfig = GammaConfig()   # --gamma caps the adaptive policies
    cost_profile: CostProfile | None = None     # the cost controller's measured costs

    def controller(self) -> GammaController:
        """A fresh γ controller (one per stream)."""
        return gamma_controller(self.gamma_policy, self.gamma, self.cost_profile)


@dataclass
class StepRecord:
    prompt: int                  # index of the prompt in the stream
    step: int                    # verification step index within the stream
    drafted: int
    accepted: int
    emitted: int                 # tokens committed by this iteration (accepted + 1, less after EOS)
    total_ms: float
    draft_ms: float
    verify_ms: float
    adapt_ms: float
    other_ms: float
    adjust_ms: float             # the method's logit adjustment, inside draft_ms
    forward_draft_ms: float      # draft model forward passes, inside draft_ms
    forward_target_ms: float     # target forward pass, inside verify_ms
    target_entropy: list[float] = field(default_factory=list)  # nats, per drafted position (T = 1)
    gamma: int = 0               # the γ the controller chose (before the generation-budget cut)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    prompt_index: int
    prompt_ids: list[int]
    output_ids: list[int]
    steps: list[StepRecord]
    prefill_ms: float
    hit_eos: bool

    @property
    def decode_ms(self) -> float:
        return sum(s.total_ms for s in self.steps)



def draft_budget(gamma: int, max_new_tokens: int, produced: int) -> int:
    """Tokens to draft in the next iteration: at most γ, and never past the generation budget
    (the iteration also emits the target's correction or bonus token). 0 or less: draft nothing."""
    return min(gamma, max_new_tokens - produced - 1)

def _cut_at_eos(proposal: Proposal, eos_id: int | None) -> Proposal:
    """Drafting past an EOS is pointless: keep the proposal up to and including the first EOS."""
    if eos_id is None or proposal.k == 0:
        return proposal
    hits = (proposal.tokens[0] == eos_id).nonzero()
    return proposal.truncate(int(hits[0]) + 1) if len(hits) else proposal


def _entropy(logits: torch.Tensor) -> list[float]:
    """logits [k, V] -> entropy in nats per row (temperature 1)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def verify(target: CausalLM, context: torch.Tensor, proposal: Proposal, sampler: Sampler):
    """Score [last, x1..xk] with the target and apply the acceptance rule.

    Returns (target_hidden [B, k+1, d], target_logits [B, k+1, V], accepted [B], next_token [B]).
    """
    feed = torch.cat([context[:, target.cache_len:], proposal.tokens], dim=1)
    hidden, logits = target.forward(feed)
    hidden, logits = hidden[:, -(proposal.k + 1):], logits[:, -(proposal.k + 1):]
    if sampler.greedy:
        accepted, next_token = accept_greedy(proposal.tokens, logits)
    else:
        p = sampler.probs(sampler.sampling_logits(logits))
        accepted, next_token = accept_sampling(proposal.tokens, proposal.q, p, sampler.generator)
    return hidden, logits, accepted, next_token


def generate(
    target: CausalLM,
    policy: DraftPolicy,
    prompt_ids: list[int] | tuple[int, ...],
    cfg: DecodeConfig,
    sampler: Sampler,
    *,
    prompt_index: int = 0,
    step0: int = 0,
    tenant: str | None = None,
    controller: GammaController | None = None,
) -> Generation:
    """Generate up to cfg.max_new_tokens after one prompt. Batch size 1. controller: the stream's
    γ controller (default: a fresh one from cfg)."""
    device = target.device
    clock = IterationClock(device)
    target.clock = clock
    policy.clock = clock
    controller = controller or cfg.controller()
    policy.p_min = controller.p_min
    context = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # [1, P]

    t0 = time.perf_counter()
    target.reset()
    if context.shape[1] > 1:
        target.forward(context[:, :-1])
    policy.begin_prompt(context, tenant)
    clock.read()
    prefill_ms = (time.perf_counter() - t0) * 1e3

    steps: list[StepRecord] = []
    produced, hit_eos = 0, False
    while produced < cfg.max_new_tokens and not hit_eos:
        interrupt.check()   # a Ctrl-C / SIGTERM that landed in a finaliser is raised here
        t_start = time.perf_counter()
        gamma = controller.next_gamma()
        room = draft_budget(gamma, cfg.max_new_tokens, produced)
        with clock.span("draft"):
            proposal = policy.propose(context, room, sampler) if room > 0 else DraftPolicy.propose(policy, context, 0, sampler)
            proposal = _cut_at_eos(proposal, cfg.eos_id)
        with clock.span("verify"):
            target_hidden, target_logits, accepted, next_token = verify(target, context, proposal, sampler)
            n = int(accepted[0])  # the one host read per iteration
        new = torch.cat([proposal.tokens[:, :n], next_token[:, None]], dim=1)
        if cfg.eos_id is not None and (new[0] == cfg.eos_id).any():
            new = new[:, : int((new[0] == cfg.eos_id).nonzero()[0]) + 1]
            hit_eos = True
        new_context = torch.cat([context, new], dim=1)
        target.crop(new_context.shape[1] - 1)
        policy.commit(new_context)
        with clock.span("adapt"):
            policy.observe(Feedback(context, proposal, target_logits, accepted, next_token, sampler,
                                    step0 + len(steps), target_hidden))
        ms = clock.read()
        total = (time.perf_counter() - t_start) * 1e3
        phases = {name: ms.get(name, 0.0) for name in ("draft", "verify", "adapt")}
        record = StepRecord(
            prompt=prompt_index,
            step=step0 + len(steps),
            drafted=proposal.k,
            accepted=n,
            emitted=new.shape[1],
            total_ms=total,
            draft_ms=phases["draft"],
            verify_ms=phases["verify"],
            adapt_ms=phases["adapt"],
            other_ms=max(0.0, total - sum(phases.values())),
            adjust_ms=ms.get("adjust", 0.0),
            forward_draft_ms=ms.get("forward_draft", 0.0),
            forward_target_ms=ms.get("forward_target", 0.0),
            gamma=gamma,
            # instrumentation, outside the timed iteration:
            target_entropy=_entropy(target_logits[0, : proposal.k]) if proposal.k else [],
        )
        steps.append(record)
        t_ctl = time.perf_counter()      # the controller learns from the record: its time is added to it
        top = proposal.top_prob[0].tolist() if proposal.top_prob is not None else []
        controller.observe(proposal.k, n, top, record)
        ctl_ms = (time.perf_counter() - t_ctl) * 1e3
        record.total_ms += ctl_ms
        record.other_ms += ctl_ms
        context = new_context
        produced += new.shape[1]
    output = context[0, len(prompt_ids):].tolist()
    policy.end_prompt(context[:, len(prompt_ids):])
    return Generation(prompt_index, list(prompt_ids), output, steps, prefill_ms, hit_eos)


@dataclass
class StreamRun:
    method: str
    generations: list[Generation]
    complete: bool
    report: dict
    cost_profile: CostProfile | None = None   # the stream's measured costs (DecodeConfig.cost_profile)

    @property
    def steps(self) -> list[StepRecord]:
        return [s for g in self.generations for s in g.steps]


def run_stream(
    target: CausalLM,
    policy: DraftPolicy,
    stream: Stream,
    cfg: DecodeConfig,
    *,
    on_prompt=None,
    switch: tuple[int, CausalLM] | None = None,
) -> StreamRun:
    """Run every prompt of a stream in order through one policy; adaptive state persists.

    switch (N, target B): prompts N, N+1, ... are verified by target B (a target-change stream;
    the policy's state and the γ controller carry over). A KeyboardInterrupt stops the stream
    and returns what finished, marked incomplete.
    """
    gen = torch.Generator(device=target.device).manual_seed(cfg.seed)
    sampler = Sampler(cfg.temperature, cfg.top_p, gen)
    policy.begin_stream()
    controller = cfg.controller() if policy.drafts else GammaController(0)
    out: list[Generation] = []
    complete = True
    try:
        for i, prompt in enumerate(stream.prompts):
            step0 = sum(len(g.steps) for g in out)
            active = switch[1] if switch is not None and i >= switch[0] else target
            out.append(generate(active, policy, prompt.ids, cfg, sampler, prompt_index=i, step0=step0, tenant=prompt.tenant,
                                controller=controller))
            if on_prompt is not None:
                on_prompt(i + 1, len(stream.prompts))
    except KeyboardInterrupt:
        complete = False
    policy.end_stream()
    report = policy.report()
    if cfg.gamma_policy.policy != "fixed" and policy.drafts:
        report = {**report, "gamma_controller": {"policy": controller.name, **controller.report()}}
    return StreamRun(policy.name, out, complete, report, cfg.cost_profile)
