"""Every metric formula, once. Names match run.json's keys (definitions: docs/engine.md).

Inputs are step records (`drift_cli.engine.loop.StepRecord`) and generations; outputs are plain
numbers and lists, ready for JSON. Functions return None where a metric does not apply
(for example `acceptance_rate` of `ar`, which drafts nothing).

Batches: a step record is one row of one iteration, its times the row's share of the
iteration's. Counts (α, τ, histograms, per-position acceptance) aggregate over rows as they are;
per-iteration times (`iteration_ms`) sum an iteration's shares back.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np

ENTROPY_EDGES = (0.0, 0.5, 1.0, 2.0, 3.0, math.inf)  # nats, for acceptance_by_entropy
ALPHA_WINDOW = 100   # verification steps per alpha_curve window
ALPHA_STRIDE = 20
NGRAM = 4


def _sum(steps, field: str) -> float:
    return float(sum(getattr(s, field) for s in steps))


def acceptance_rate(steps) -> float | None:
    """alpha = accepted draft tokens / drafted tokens (prefix-conditioned)."""
    drafted = _sum(steps, "drafted")
    return _sum(steps, "accepted") / drafted if drafted else None


def acceptance_by_position(steps, gamma: int) -> list[float | None]:
    """P(position i accepted | position i drafted) for i = 1..gamma."""
    out = []
    for i in range(gamma):
        drafted = [s for s in steps if s.drafted > i]
        out.append(sum(s.accepted > i for s in drafted) / len(drafted) if drafted else None)
    return out


def acceptance_by_depth(steps, gamma: int) -> list[float | None]:
    """Trees: P(depth d accepted | the walk reached a node with children at depth d), d = 1..gamma.
    A tree's step records its accepted path as a chain (`drafted`: the path and the first
    candidate tried below it), so this is `acceptance_by_position` over the tree steps; None for
    a chain run."""
    tree = [s for s in steps if getattr(s, "nodes", 0)]
    return acceptance_by_position(tree, gamma) if tree else None


def acceptance_by_sibling_rank(steps) -> list[float | None] | None:
    """Trees: P(the child of sibling rank r is accepted | it was tried), r = 0, 1, ...: a child is
    tried when every elder sibling was rejected. None for a chain run."""
    tree = [s for s in steps if getattr(s, "nodes", 0)]
    if not tree:
        return None
    width = max([r + 1 for s in tree for r in s.ranks] + [s.tried for s in tree] + [1])
    tried, hit = [0] * width, [0] * width
    for s in tree:
        for r in s.ranks:                        # ranks 0..r tried, r accepted
            for i in range(r + 1):
                tried[i] += 1
            hit[r] += 1
        for i in range(s.tried):                 # every child of the last node tried, none accepted
            tried[i] += 1
    return [h / t if t else None for h, t in zip(hit, tried, strict=True)]


def nodes_per_step(steps) -> float | None:
    """Trees: the mean tree size per iteration (nodes the target scored besides the root)."""
    tree = [s for s in steps if getattr(s, "nodes", 0)]
    return _sum(tree, "nodes") / len(steps) if tree else None


def accept_length_histogram(steps, gamma: int) -> list[int]:
    """Iterations (that drafted something) by number of accepted drafts, 0..gamma."""
    hist = [0] * (gamma + 1)
    for s in steps:
        if s.drafted:
            hist[min(s.accepted, gamma)] += 1
    return hist


def mean_accepted_length(steps) -> float | None:
    """tau = 1 + accepted / iterations (counts the correction/bonus token, as vLLM and Spec-Bench)."""
    return 1.0 + _sum(steps, "accepted") / len(steps) if steps else None


def mean_accepted_drafts(steps) -> float | None:
    return _sum(steps, "accepted") / len(steps) if steps else None


def tokens_per_s(steps) -> float | None:
    """Decode throughput: committed tokens / decode time (prefill excluded)."""
    ms = _sum(steps, "total_ms")
    return _sum(steps, "emitted") / ms * 1e3 if ms else None


def iteration_times_ms(steps) -> list[float]:
    """Wall time of each iteration: a batch-1 record is one; a batch's rows (one step index) are
    summed back from their shares."""
    out: list[float] = []
    rows: dict[int, int] = {}            # step index -> its slot in out
    for s in steps:
        if getattr(s, "batch", 1) == 1:
            out.append(s.total_ms)
        elif s.step in rows:
            out[rows[s.step]] += s.total_ms
        else:
            rows[s.step] = len(out)
            out.append(s.total_ms)
    return out


def step_ms_quantile(steps, q: float) -> float | None:
    """A quantile of the iteration times (one row per iteration at batch 1)."""
    return float(np.quantile(iteration_times_ms(steps), q)) if steps else None


def throughput_tokens_per_s(generations, wall_ms: float) -> float | None:
    """Generated tokens per second over the whole stream (prefills and admissions included)."""
    return sum(len(g.output_ids) for g in generations) / wall_ms * 1e3 if wall_ms else None


def latency_ms_quantile(generations, q: float) -> float | None:
    """A quantile of the per-request latency, admission to finish."""
    return float(np.quantile([g.latency_ms for g in generations], q)) if generations else None


def ratio(x: float | None, base: float | None) -> float | None:
    return x / base if x is not None and base else None


def overhead_ms_per_step(steps) -> float | None:
    """Adaptation time inside an iteration: the method's logit adjustment plus its update."""
    return (_sum(steps, "adjust_ms") + _sum(steps, "adapt_ms")) / len(steps) if steps else None


def overhead_pct(steps) -> float | None:
    total = _sum(steps, "total_ms")
    return 100.0 * (_sum(steps, "adjust_ms") + _sum(steps, "adapt_ms")) / total if total else None


def harness_overhead_pct(steps) -> float | None:
    """Share of iteration time outside both models' forward passes (the harness's own cost,
    plus the method's adjustment and update)."""
    total = _sum(steps, "total_ms")
    fwd = _sum(steps, "forward_draft_ms") + _sum(steps, "forward_target_ms")
    return 100.0 * (total - fwd) / total if total else None


def cost_ratio(steps, ar_steps) -> float | None:
    """c = draft time per drafted token / target time per autoregressive step."""
    drafted = _sum(steps, "drafted")
    if not drafted or not ar_steps:
        return None
    return (_sum(steps, "draft_ms") / drafted) / (_sum(ar_steps, "total_ms") / len(ar_steps))


def predicted_speedup(alpha: float | None, gamma: int, c: float | None) -> float | None:
    """The i.i.d. formula (Leviathan et al.): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))."""
    if alpha is None or c is None:
        return None
    expected = gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected / (gamma * c + 1)


def expected_emitted(alpha_by_position: Sequence[float], k: int) -> float:
    """Expected tokens an iteration that drafts k emits: 1 + sum_{i<=k} prod_{j<=i} alpha_j, with
    alpha_j = P(position j accepted | j-1 accepted) (acceptances come in runs; no i.i.d. assumption)."""
    out, run = 1.0, 1.0
    for a in alpha_by_position[:k]:
        run *= a
        out += run
    return out


def iteration_ms(k: int, draft_ms_per_token: float, verify_ms: Sequence[float], overhead_ms: float,
                 nodes: int | None = None) -> float:
    """The cost model of one iteration that drafts k: k draft steps, the target scoring k+1 tokens
    (verify_ms[k], measured per width) and the iteration's time outside both models. A tree of
    `nodes` nodes and depth k: k draft steps (one forward per depth), the target scoring nodes+1."""
    return k * draft_ms_per_token + verify_ms[k if nodes is None else nodes] + overhead_ms


def expected_tree_emitted(accept: Sequence[Sequence[float]], depth: int, max_nodes: int) -> list[float]:
    """Expected tokens an iteration emits with the best tree of n nodes, n = 0..max_nodes, and
    depth at most `depth`, when the child of sibling rank r at depth d is accepted with
    probability accept[d-1][r] given that its parent was and its elder siblings were not.

    A node's value is the probability that it is accepted: its parent's value times
    prod_{j<r} (1 - a(d, j)) times a(d, r). The tree of n nodes is grown best-first from the root
    (a node admits its first child and its next sibling, as the drafters' own rerank does), and an
    iteration emits 1 + the sum of its nodes' values (tokens along the accepted path, plus the
    correction or bonus)."""
    out = [1.0]
    if depth < 1 or not accept or not accept[0]:
        return out + [1.0] * max_nodes
    ranks = len(accept[0])
    # (-value, order, depth, rank, the parent's value, prod of (1 - a) over the elder siblings)
    heap = [(-accept[0][0], 0, 1, 0, 1.0, 1.0)]
    order = 1
    while len(out) <= max_nodes:
        if not heap:
            out.append(out[-1])
            continue
        neg, _, d, r, parent, survive = heapq.heappop(heap)
        out.append(out[-1] - neg)
        if d < depth:                                              # its first child
            heapq.heappush(heap, (neg * accept[d][0], order, d + 1, 0, -neg, 1.0))
            order += 1
        if r + 1 < ranks:                                          # its next sibling
            left = survive * (1 - accept[d - 1][r])
            heapq.heappush(heap, (-parent * left * accept[d - 1][r + 1], order, d, r + 1, parent, left))
            order += 1
    return out


def goodput(alpha_by_position: Sequence[float], k: int, draft_ms_per_token: float, verify_ms: Sequence[float],
            overhead_ms: float) -> float:
    """Expected emitted tokens per ms when drafting k: what the `cost` γ controller maximises."""
    return expected_emitted(alpha_by_position, k) / iteration_ms(k, draft_ms_per_token, verify_ms, overhead_ms)


def iteration_overhead_ms(step) -> float:
    """An iteration's time outside drafting and the target's forward pass (acceptance, rollback,
    adaptation, the harness)."""
    return max(0.0, step.total_ms - step.draft_ms - step.forward_target_ms)


def predicted_speedup_measured(generations, ar_generations, verify_ratio: Sequence[float] | None) -> float | None:
    """The measured speedup (`paired_speedup`: the mean over prompts of each prompt's throughput
    against ar's on the same prompt) with every iteration's measured time replaced by the cost
    model's (`iteration_ms`), so that the two differ only where the model does. The model's
    inputs are measured, pooled over the stream: scoring k+1 tokens costs verify_ratio[k] (the
    profile's cost of k+1 tokens against one) times ar's mean one-token forward; the draft's cost
    per drafted token and the time outside the models per iteration are this run's own (draft
    time that drafted nothing, such as a confidence stop's last forward, counts as time outside
    the drafted tokens)."""
    steps = [s for g in generations for s in g.steps]
    ar_steps = [s for g in ar_generations for s in g.steps]
    if not steps or not ar_steps or verify_ratio is None or len(generations) != len(ar_generations):
        return None
    if max(s.drafted for s in steps) >= len(verify_ratio):
        return None
    drafted = _sum(steps, "drafted")
    t_draft = _sum(steps, "draft_ms") / drafted if drafted else 0.0
    t_one = _sum(ar_steps, "forward_target_ms") / len(ar_steps)
    verify_ms = [r * t_one for r in verify_ratio]
    overhead = (_sum(steps, "total_ms") - _sum(steps, "forward_target_ms") - t_draft * drafted) / len(steps)
    ratios = []
    for g, a in zip(generations, ar_generations, strict=True):
        modelled = sum(iteration_ms(s.drafted, t_draft, verify_ms, overhead) for s in g.steps)
        ar_ms = sum(s.total_ms for s in a.steps)
        if modelled > 0 and ar_ms > 0 and a.output_ids:
            ratios.append((len(g.output_ids) / modelled) / (len(a.output_ids) / ar_ms))
    return float(np.mean(ratios)) if ratios else None


NO_SOURCE = "none"   # by_source's label for rows of a multi-source method with nothing asked of them


def by_source(steps) -> dict | None:
    """A multi-source method's (`hybrid`) steps by the source that proposed them: each source's
    share of the steps and its α and τ (the formulas above, on its steps), beside the totals;
    the share of iteration time spent choosing the source (`choose_ms`). None for a
    single-source method (no step names a source)."""
    if not any(s.source for s in steps):
        return None
    groups: dict[str, list] = {}
    for s in steps:
        groups.setdefault(s.source or NO_SOURCE, []).append(s)
    total = _sum(steps, "total_ms")
    return {
        "sources": {name: {"share": len(g) / len(steps), "iterations": len(g),
                           "drafted_tokens": int(_sum(g, "drafted")), "accepted_tokens": int(_sum(g, "accepted")),
                           "acceptance_rate": acceptance_rate(g), "mean_accepted_length": mean_accepted_length(g)}
                    for name, g in groups.items()},
        "choose_ms_per_step": _sum(steps, "choose_ms") / len(steps),
        "choose_pct": 100.0 * _sum(steps, "choose_ms") / total if total else None,
    }


def gamma_histogram(steps, gamma: int) -> list[int]:
    """Iterations by the γ their controller chose, 0..gamma."""
    hist = [0] * (gamma + 1)
    for s in steps:
        hist[min(s.gamma, gamma)] += 1
    return hist


def per_prompt_tokens_per_s(generations) -> list[float]:
    return [len(g.output_ids) / g.decode_ms * 1e3 if g.decode_ms else 0.0 for g in generations]


def _bootstrap(n: int, statistic, n_boot: int, seed: int, level: float) -> tuple[float, float]:
    """Percentile bootstrap over n units (prompts): statistic(idx [n_boot, n]) -> [n_boot]."""
    if n == 0:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    with np.errstate(divide="ignore", invalid="ignore"):   # a ratio's resample may have no denominator
        values = statistic(idx)
    lo, hi = np.nanquantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean, resampling prompts."""
    x = np.asarray(values, dtype=float)
    return _bootstrap(len(x), lambda idx: x[idx].mean(axis=1), n_boot, seed, level)


def bootstrap_ratio_ci(num: Sequence[float], den: Sequence[float], n_boot: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of a pooled ratio sum(num) / sum(den) (e.g. acceptance: accepted over
    drafted per prompt), resampling prompts."""
    a, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return _bootstrap(len(a), lambda idx: a[idx].sum(axis=1) / d[idx].sum(axis=1), n_boot, seed, level)


# two-sided 95% Student t quantiles t(0.975, df), df = 1..30; beyond, the normal 1.96
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def seed_mean_ci95(values: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean over independent repeats (seeds, stream shuffles) and its Student-t 95% CI (None for one)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, None
    half = (T975[len(x) - 2] if len(x) - 1 <= len(T975) else 1.96) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, (mean - half, mean + half)


def acceptance_ci(generations) -> tuple[float, float] | None:
    """Bootstrap 95% CI of acceptance_rate over prompts (prompts that drafted nothing carry no weight)."""
    acc = [sum(s.accepted for s in g.steps) for g in generations]
    dr = [sum(s.drafted for s in g.steps) for g in generations]
    return bootstrap_ratio_ci(acc, dr) if sum(dr) else None


def paired_speedup(generations, ar_generations) -> dict | None:
    """Per-prompt paired ratio of decode throughput vs `ar` (same prompts); mean and bootstrap 95% CI."""
    if not ar_generations or len(generations) != len(ar_generations):
        return None
    mine = per_prompt_tokens_per_s(generations)
    base = per_prompt_tokens_per_s(ar_generations)
    ratios = [m / b for m, b in zip(mine, base, strict=True) if b > 0]
    lo, hi = bootstrap_ci(ratios)
    return {"speedup": float(np.mean(ratios)), "speedup_ci95": [lo, hi], "speedup_per_prompt": ratios}


def alpha_curve(steps, window: int = ALPHA_WINDOW, stride: int = ALPHA_STRIDE) -> list[tuple[int, float]]:
    """Windowed alpha over verification steps: [(last step of the window, alpha in the window)]."""
    acc = np.array([s.accepted for s in steps], dtype=float)
    dr = np.array([s.drafted for s in steps], dtype=float)
    if len(steps) == 0:
        return []
    window = min(window, len(steps))
    out = []
    for end in range(window, len(steps) + 1, stride):
        d = dr[end - window:end].sum()
        if d:
            out.append((end, float(acc[end - window:end].sum() / d)))
    return out


def convergence_steps(curve: list[tuple[int, float]], tail: float = 0.25, frac: float = 0.95) -> int | None:
    """Steps until the windowed alpha first reaches, and then stays within, 95% of its final
    plateau (the mean of the last quarter of the curve)."""
    if len(curve) < 4:
        return None
    values = [a for _, a in curve]
    plateau = float(np.mean(values[int(len(values) * (1 - tail)):]))
    threshold = frac * plateau
    last_below = max((i for i, a in enumerate(values) if a < threshold), default=-1)
    if last_below == len(values) - 1:
        return None
    return curve[last_below + 1][0]


def alpha_by_half(generations) -> list[float | None]:
    """alpha over the stream's first half of prompts and over its second half, in stream order.
    Two runs of one stream see the same prompts in each half, so the difference of their first
    halves compares how soon two banks learn, paired on the prompts (where `convergence_steps`
    reads a short stream's prompt-to-prompt swings instead)."""
    ordered = sorted(generations, key=lambda g: g.prompt_index)
    half = len(ordered) // 2
    return [acceptance_rate([s for g in part for s in g.steps]) for part in (ordered[:half], ordered[half:])]


SWITCH_WINDOW = 50   # verification steps per window around a target switch


def recovery_steps(after, level: float, window: int, frac: float = 0.95) -> int | None:
    """Steps after a target switch until the windowed alpha (the last `window` steps, all after the
    switch) is first back within `frac` of the pre-switch level: the end of the first such window
    (so `window` itself means no measurable drop); None if it never is within the stream."""
    acc = np.cumsum([0.0] + [s.accepted for s in after])
    dr = np.cumsum([0.0] + [s.drafted for s in after])
    for end in range(window, len(after) + 1):
        d = dr[end] - dr[end - window]
        if d and (acc[end] - acc[end - window]) / d >= frac * level:
            return end
    return None


def target_change(steps, switch_prompt: int, window: int = SWITCH_WINDOW) -> dict | None:
    """Around a target switch before prompt `switch_prompt`: alpha over the last `window` steps
    before it and the first `window` after, the drop, and `recovery_steps`."""
    split = next((i for i, s in enumerate(steps) if s.prompt >= switch_prompt), None)
    if split is None or split == 0:
        return None
    before, after = steps[:split], steps[split:]
    w = min(window, len(before), len(after))
    a_before, a_after = acceptance_rate(before[-w:]), acceptance_rate(after[:w])
    return {
        "switch_prompt": switch_prompt,
        "switch_step": split,
        "window": w,
        "alpha_before": a_before,
        "alpha_after": a_after,
        "alpha_drop": None if None in (a_before, a_after) else a_before - a_after,
        "recovery_steps": recovery_steps(after, a_before, w) if a_before else None,
        "alpha_after_stream": acceptance_rate(after),
    }


def acceptance_by_entropy(steps, edges=ENTROPY_EDGES) -> list[dict]:
    """alpha bucketed by the target's entropy (nats) at each drafted position.

    The last bucket is open: its `entropy_hi` is None (JSON null), never a bare Infinity."""
    buckets = [[0, 0] for _ in range(len(edges) - 1)]   # [accepted, drafted]
    for s in steps:
        for i, h in enumerate(s.target_entropy):
            b = next(j for j in range(len(edges) - 1) if h < edges[j + 1])
            buckets[b][1] += 1
            buckets[b][0] += s.accepted > i
    return [
        {"entropy_lo": edges[j], "entropy_hi": edges[j + 1] if math.isfinite(edges[j + 1]) else None, "drafted": d, "acceptance_rate": a / d if d else None}
        for j, (a, d) in enumerate(buckets)
    ]


def ar_match_rate(generations, ar_generations) -> float | None:
    """Share of prompts whose output ids equal `ar`'s exactly (greedy losslessness)."""
    if not ar_generations or len(generations) != len(ar_generations):
        return None
    same = [g.output_ids == a.output_ids for g, a in zip(generations, ar_generations, strict=True)]
    return sum(same) / len(same)


def stream_statistics(generations, n: int = NGRAM) -> dict:
    """repeated_ngram_share: share of output tokens whose n-gram (ending at that token) already
    occurred earlier in the prompt or anywhere earlier in the stream; distinct_4; output lengths."""
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    outputs_grams: list[tuple[int, ...]] = []
    for g in generations:
        seq = list(g.prompt_ids) + list(g.output_ids)
        start = len(g.prompt_ids)
        for j in range(n - 1, start):                 # the prompt's own n-grams
            seen.add(tuple(seq[j - n + 1:j + 1]))
        for j in range(start, len(seq)):
            if j < n - 1:
                continue
            gram = tuple(seq[j - n + 1:j + 1])
            total += 1
            repeated += gram in seen
            seen.add(gram)
            outputs_grams.append(gram)
    lengths = [len(g.output_ids) for g in generations]
    return {
        "repeated_ngram_share": repeated / total if total else None,
        "distinct_4": len(set(outputs_grams)) / len(outputs_grams) if outputs_grams else None,
        "output_tokens": sum(lengths),
        "mean_output_length": float(np.mean(lengths)) if lengths else None,
    }


def shift_penalty(s_indist: float | None, s_shift: float | None) -> float | None:
    """(S_indist - S_shift) / (S_indist - 1): the fraction of the in-distribution gain lost.

    Undefined (None) when there is no in-distribution gain to lose (S_indist <= 1)."""
    if s_indist is None or s_shift is None or s_indist <= 1.0:
        return None
    return (s_indist - s_shift) / (s_indist - 1.0)


def gap_closed(x_drift: float | None, x_vanilla: float | None, x_offline: float | None,
               noise: float | None = 0.0) -> float | None:
    """(x_drift - x_vanilla) / (x_offline - x_vanilla), for x = alpha or speedup.

    None (printed n/a) unless the denominator, the gap itself, exceeds `noise`: its own 95% CI
    half-width (`difference_half_width`). When offline barely differs from vanilla the ratio
    divides by noise and means nothing; noise None (the CI is unknown) is n/a too."""
    if None in (x_drift, x_vanilla, x_offline) or noise is None:
        return None
    gap = x_offline - x_vanilla
    if abs(gap) <= noise:
        return None
    return (x_drift - x_vanilla) / gap


def difference_half_width(ci_a: Sequence[float] | None, ci_b: Sequence[float] | None) -> float | None:
    """The 95% CI half-width of a - b from the two figures' own 95% CIs (their half-widths added in
    quadrature, as for independent estimates; for positively correlated runs on the same prompts
    this is wider than the paired interval, so a gap it calls real is real). None if either is unknown."""
    if not ci_a or not ci_b or None in (*ci_a, *ci_b):
        return None
    return math.hypot((ci_a[1] - ci_a[0]) / 2, (ci_b[1] - ci_b[0]) / 2)


def method_metrics(run, gamma: int, ar_run=None, greedy: bool = True, verify_ratio: Sequence[float] | None = None,
                   switch_prompt: int | None = None) -> dict:
    """All per-method metrics for one stream run (ar_run: the `ar` run on the same stream;
    verify_ratio: the cost profile's k+1 tokens against one, k = 0..gamma; switch_prompt: the
    first prompt of a target-change stream's second target)."""
    steps = run.steps
    ar_steps = ar_run.steps if ar_run is not None else None
    alpha = acceptance_rate(steps)
    curve = alpha_curve(steps)
    c = cost_ratio(steps, ar_steps)
    out = {
        "acceptance_rate": alpha,
        "acceptance_ci95": acceptance_ci(run.generations),
        "acceptance_by_position": acceptance_by_position(steps, gamma),
        "accept_length_histogram": accept_length_histogram(steps, gamma),
        "acceptance_by_depth": acceptance_by_depth(steps, gamma),
        "acceptance_by_sibling_rank": acceptance_by_sibling_rank(steps),
        "nodes_per_step": nodes_per_step(steps),
        "mean_accepted_length": mean_accepted_length(steps),
        "mean_accepted_drafts": mean_accepted_drafts(steps),
        "tokens_per_s": tokens_per_s(steps),
        "prefill_ms_mean": float(np.mean([g.prefill_ms for g in run.generations])) if run.generations else None,
        "iterations": len(steps),
        "drafted_tokens": int(_sum(steps, "drafted")),
        "accepted_tokens": int(_sum(steps, "accepted")),
        "p50_step_ms": step_ms_quantile(steps, 0.5),
        "p99_step_ms": step_ms_quantile(steps, 0.99),
        # the decoding thread's time over the stream's iterations (beside a second thread's CPU
        # seconds: osd's worker_seconds, --background-load's)
        "decode_seconds": _sum(steps, "total_ms") / 1e3,
        "batch_size": run.batch_size,
        "throughput_tokens_per_s": throughput_tokens_per_s(run.generations, run.wall_ms),
        "throughput_speedup": ratio(throughput_tokens_per_s(run.generations, run.wall_ms),
                                    throughput_tokens_per_s(ar_run.generations, ar_run.wall_ms)) if ar_run else None,
        "latency_ms_p50": latency_ms_quantile(run.generations, 0.5),
        "latency_ms_p99": latency_ms_quantile(run.generations, 0.99),
        "overhead_ms_per_step": overhead_ms_per_step(steps),
        "overhead_pct": overhead_pct(steps),
        "harness_overhead_pct": harness_overhead_pct(steps),
        "cost_ratio": c,
        "predicted_speedup": predicted_speedup(alpha, gamma, c) if run.method != "ar" else 1.0,
        "predicted_speedup_measured": 1.0 if run.method == "ar" else (
            predicted_speedup_measured(run.generations, ar_run.generations, verify_ratio) if ar_run else None),
        "gamma_histogram": gamma_histogram(steps, gamma),
        "alpha_curve": curve,
        "convergence_steps": convergence_steps(curve),
        "alpha_by_half": alpha_by_half(run.generations),
        "acceptance_by_entropy": acceptance_by_entropy(steps),
        "ar_match_rate": ar_match_rate(run.generations, ar_run.generations) if (greedy and ar_run) else None,
        "stream": stream_statistics(run.generations),
        "by_source": by_source(steps),
        "complete": run.complete,
    }
    if switch_prompt is not None:
        out["target_change"] = target_change(steps, switch_prompt) if run.method != "ar" else None
    sp = paired_speedup(run.generations, ar_run.generations) if ar_run is not None else None
    out.update(sp or {"speedup": None, "speedup_ci95": None, "speedup_per_prompt": None})
    return out
