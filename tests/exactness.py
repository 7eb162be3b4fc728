"""The engine's statistical losslessness test, reusable by every method's tests.

Speculative sampling must leave the target's output distribution unchanged. We draw many
independent generations of the first `n_tokens` tokens after a fixed prompt and compare the
empirical joint distribution with the exact one computed from the target, with a chi-square
goodness-of-fit test. Categories with small expected counts are pooled (expected >= 5 each).
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch
from scipy.stats import chisquare

from drift_cli.engine.gamma import GammaConfig
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, generate, run_stream
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import TreeConfig
from drift_cli.methods.base import DraftPolicy
from drift_cli.stream import Prompt, Stream
from tests.scale import scaled

SIGNIFICANCE = 1e-3  # a correct engine fails this test with probability 0.001


@torch.inference_mode()
def exact_joint(target: torch.nn.Module, prompt: list[int], n_tokens: int, sampler: Sampler) -> dict[tuple[int, ...], float]:
    """P(first n_tokens = t) under the target with the sampler's temperature / top-p."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for prefix, pr in probs.items():
            ids = torch.tensor([prompt + list(prefix)])
            z = target(ids).logits[0, -1].float()
            p = sampler.probs(sampler.sampling_logits(z))
            for t, pt in enumerate(p.tolist()):
                if pt > 0:
                    nxt[prefix + (t,)] = pr * pt
        probs = nxt
    return probs


def sample_first_tokens(
    target: torch.nn.Module,
    make_policy: Callable[[], DraftPolicy],
    prompt: list[int],
    n_tokens: int,
    samples: int,
    temperature: float = 1.0,
    top_p: float | None = None,
    gamma: int = 3,
    seed: int = 0,
    batch: int = 1,
    gamma_policy: GammaConfig = GammaConfig(),
    tree: TreeConfig = TreeConfig(),
) -> dict[tuple[int, ...], int]:
    """batch 1: `generate` once per sample; batch B: one stream of `samples` copies of the prompt,
    B rows at a time (continuous batching). Adaptive state and the γ controller persist across
    the samples (as across the prompts of a stream), so an adaptive γ varies between samples.
    The count is scaled by $DRIFT_TEST_SCALE (tests/scale.py)."""
    samples = scaled(samples)
    lm = CausalLM(target, "target")
    policy = make_policy()
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=n_tokens + gamma, temperature=temperature, top_p=top_p,
                       seed=seed, batch_size=batch, gamma_policy=gamma_policy, tree=tree)
    if batch > 1:
        stream = Stream("exactness", "test", [Prompt(tuple(prompt), f"s{i}") for i in range(samples)], n_tokens + gamma)
        outputs = [g.output_ids for g in run_stream(lm, policy, stream, cfg).generations]
    else:
        policy.begin_stream()
        sampler = Sampler(temperature, top_p, torch.Generator().manual_seed(seed))
        controller = cfg.controller()
        outputs = [generate(lm, policy, prompt, cfg, sampler, controller=controller).output_ids for _ in range(samples)]
    counts: dict[tuple[int, ...], int] = {}
    for out in outputs:
        key = tuple(out[:n_tokens])
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square_p_value(counts: dict[tuple[int, ...], int], exact: dict[tuple[int, ...], float]) -> float:
    n = sum(counts.values())
    assert set(counts) <= set(exact), "sampled a sequence the target gives probability 0"
    cats = sorted(exact, key=lambda c: -exact[c])
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for c in cats:
        e = exact[c] * n
        if e >= 5:
            obs.append(counts.get(c, 0))
            exp.append(e)
        else:
            pool_o += counts.get(c, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)  # guard float drift
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def sampling_p_value(target, make_policy, prompt, n_tokens=2, samples=3000, **kw) -> float:
    sampler = Sampler(kw.get("temperature", 1.0), kw.get("top_p"))
    exact = exact_joint(target, prompt, n_tokens, sampler)
    return chi_square_p_value(sample_first_tokens(target, make_policy, prompt, n_tokens, samples, **kw), exact)


__all__ = ["SIGNIFICANCE", "sampling_p_value", "exact_joint", "chi_square_p_value", "itertools"]
