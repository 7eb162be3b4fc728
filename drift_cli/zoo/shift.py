"""Is the shift real? Greedy acceptance of the zoo's draft against its target, per scenario.

For greedy speculative decoding the output is the target's greedy continuation, and the draft's
i-th proposal in a step is conditioned on its earlier proposals, which equal the target's tokens
whenever they were accepted. So one pass suffices: let the target continue each prompt greedily,
mark every position where the draft's argmax (teacher-forced on that continuation) equals the
target's token, and replay the engine's verify loop over those marks (its draft budget,
`engine.loop.draft_budget`, and its acceptance rule, `engine.acceptance.accepted_prefix`). The
replay gives the `acceptance_rate` (accepted / drafted) that `drift bench --temperature 0`
measures with `vanilla` on the same stream (tests/test_zoo_parts.py checks it equals
`run_stream`'s), without timing anything; up to EOS handling: the continuation here never
stops early.
"""

from __future__ import annotations

import torch

from drift_cli.engine.acceptance import accepted_prefix
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import draft_budget


@torch.inference_mode()
def greedy_continuations(target: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """prompts [B, P] -> [B, P + new_tokens]: the target's greedy continuation."""
    lm = CausalLM(target, "target")
    lm.reset()
    _, logits = lm.forward(prompts)
    out = [prompts]
    for _ in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)        # [B, 1]
        out.append(nxt)
        _, logits = lm.forward(nxt)
    return torch.cat(out, dim=1)


@torch.inference_mode()
def draft_matches(draft: torch.nn.Module, seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[B, new] bool: does the draft's argmax after seqs[:, :t] equal seqs[:, t], for t >= prompt_len."""
    logits = draft(input_ids=seqs[:, :-1]).logits           # [B, L-1, V]; position t-1 predicts t
    return logits[:, prompt_len - 1:].argmax(-1) == seqs[:, prompt_len:]


def replay_greedy(matches: torch.Tensor, gamma: int) -> tuple[int, int]:
    """(accepted, drafted) of the engine's greedy verify loop over match marks [B, new]: each
    iteration drafts `draft_budget` tokens and accepts their all-match prefix (the engine's
    `accepted_prefix`), then the target adds its correction or bonus token."""
    accepted = drafted = 0
    for row in matches.bool():
        produced, new = 0, row.shape[0]
        while produced < new:
            k = max(0, draft_budget(gamma, new, produced))
            n = int(accepted_prefix(row[None, produced:produced + k])[0]) if k else 0
            accepted, drafted = accepted + n, drafted + k
            produced += n + 1
    return accepted, drafted


@torch.inference_mode()
def teacher_forced_agreement(draft: torch.nn.Module, target: torch.nn.Module, seqs: torch.Tensor) -> float:
    """Share of positions where draft and target argmax agree on the given (real) text [B, L]."""
    d = draft(input_ids=seqs).logits.argmax(-1)
    t = target(input_ids=seqs).logits.argmax(-1)
    return (d == t).float().mean().item()


def greedy_acceptance(draft: torch.nn.Module, target: torch.nn.Module, prompts: torch.Tensor,
                      new_tokens: int, gamma: int) -> dict:
    seqs = greedy_continuations(target, prompts, new_tokens)
    matches = draft_matches(draft, seqs, prompts.shape[1])
    accepted, drafted = replay_greedy(matches, gamma)
    return {"acceptance_rate": accepted / drafted, "token_agreement": matches.float().mean().item(),
            "real_text_agreement": teacher_forced_agreement(draft, target, prompts)}


SHIFTED = ("code", "law", "jargon", "temporal")


def stream_prompts(scenario: str, split: str, tokenizer, max_prompts: int) -> tuple[torch.Tensor, int]:
    """The bench's own prompt stream for (scenario, split): prompts [B, P] and its max_new_tokens."""
    from drift_cli.scenarios import build_stream

    stream = build_stream(scenario, split, tokenizer, max_prompts=max_prompts)
    return torch.tensor([list(p.ids) for p in stream.prompts], dtype=torch.long), stream.max_new_tokens


def shift_report(preset: str, scenarios: tuple[str, ...] = ("indist",) + SHIFTED, split: str = "dev",
                 max_prompts: int = 40, gamma: int = 4, offline: str | None = None,
                 new_tokens: int | None = None, progress=None) -> dict:
    """Greedy acceptance of the base draft (and the `offline` divergence's drafts) per scenario."""
    from drift_cli.zoo.build import ensure_offline_draft, ensure_zoo, load_model
    from drift_cli.zoo.tokenizer import load_tokenizer

    pair = ensure_zoo(preset, progress)
    tok = load_tokenizer(pair.tokenizer)
    target, draft = load_model(pair.target), load_model(pair.draft)
    rows = {}
    for i, scenario in enumerate(scenarios):
        prompts, stream_new = stream_prompts(scenario, split, tok, max_prompts)
        n = new_tokens or stream_new
        rows[scenario] = {"base": greedy_acceptance(draft, target, prompts, n, gamma)}
        if offline and scenario != "indist":
            tuned = load_model(ensure_offline_draft(preset, scenario, offline, progress=progress))
            rows[scenario]["offline"] = greedy_acceptance(tuned, target, prompts, n, gamma)
        if progress:
            progress("shift report", i + 1, len(scenarios))
    control = rows.get("indist", {}).get("base", {}).get("acceptance_rate")
    for scenario, row in rows.items():
        a = row["base"]["acceptance_rate"]
        row["gap_vs_indist"] = None if control is None or scenario == "indist" else control - a
        row["offline_gain"] = row["offline"]["acceptance_rate"] - a if "offline" in row else None
    return {"preset": preset, "split": split, "gamma": gamma, "max_prompts": max_prompts,
            "offline_divergence": offline, "scenarios": rows}
