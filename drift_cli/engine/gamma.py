"""Speculation-length controllers: how many tokens to draft in the next iteration.

A controller lives for one stream (its state persists across the stream's prompts, as a
method's adaptive state does) and composes with every drafting method. Per iteration the loop
asks `next_gamma()` for γ (at most `--gamma`, the cap), hands it to the draft policy as its
budget, and after verification calls `observe(drafted, accepted, top_probs, record)`.

  fixed       γ = --gamma every iteration (the default; today's behaviour)
  hf          transformers' assisted-generation schedule: +2 after an iteration whose drafts
              were all accepted, −1 otherwise (at least 1), capped at --gamma
  ema         SGLang-style tiers: an EMA of the accepted drafts per iteration; γ = the smallest
              tier (1, 2, 4, 8, ... and --gamma) of at least round(EMA) + 1
  confidence  llama.cpp's `p-min`: γ = --gamma, and the draft stops inside its own loop before
              the first position whose top probability (of the distribution it would draw from,
              DRIFT's bias included) is below --gamma-p-min (`ModelDraftPolicy.propose`)
  cost        goodput-optimal: γ in 0..--gamma maximising expected emitted tokens per
              millisecond (`drift_cli.metrics.goodput`), from online α-by-position estimates and
              the measured costs of drafting and of scoring γ+1 tokens (`CostProfile`); with
              trees (--tree-nodes N), γ and the node budget n <= N together, from online
              acceptance estimates by depth and sibling rank and the cost of scoring n+1 tokens

Every controller is lossless: γ (and a tree's node budget) depends only on what earlier
iterations revealed, and the confidence stop only on the draft's own distribution at the
position, before a token is drawn. Every controller but `cost` keeps the node budget at
--tree-nodes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from drift_cli.knobs import Settings, between, knob

if TYPE_CHECKING:
    import torch
# torch and drift_cli.metrics are imported where they are used: the command line reads
# GammaConfig (its flags) without loading either

GAMMA_POLICIES = ("fixed", "hf", "ema", "confidence", "cost")


@dataclass(frozen=True)
class GammaConfig(Settings):
    policy: str = knob("fixed", "--gamma-policy", "speculation length: fixed (--gamma), hf (+2/-1), ema (tiers), "
                       "confidence (stop below --gamma-p-min) or cost (goodput-optimal); --gamma caps the others",
                       choices=GAMMA_POLICIES, selects="γ controller")
    p_min: float = knob(0.75, "--gamma-p-min", "confidence: stop drafting when the draft's top probability is below this",
                        ok=between(0.0, 1.0), rule="must be in [0, 1]", needs=("policy", "confidence"))
    ema_rate: float = knob(0.3, "--gamma-ema-rate", "ema: weight of the newest iteration's accepted drafts",
                           ok=lambda x: 0.0 < x <= 1.0, rule="must be in (0, 1]", needs=("policy", "ema"))
    # cost: per-iteration decay of the α-by-position counts (tracks a shift; also re-explores)
    decay: float = knob(0.98, "--gamma-cost-decay", "cost: per-iteration decay of the α-by-position counts",
                        ok=lambda x: 0.0 < x <= 1.0, rule="must be in (0, 1]", needs=("policy", "cost"))


@dataclass(frozen=True)
class CostProfile:
    """Measured costs before the stream (`profile_costs`): the target scoring w = 1..γ+1 tokens
    after the first prompt (ms per width; with trees, w up to --tree-nodes + 1: a tree of n nodes
    is scored with its root, n + 1 positions) and the draft's one-token step, each beside its
    weight-read floor (`drift_cli.engine.floor`: the bytes a forward must read over the read
    bandwidth measured in the same process; None where not measured)."""

    verify_ms: tuple[float, ...]        # [w - 1]: scoring w tokens
    draft_ms_per_token: float
    floor_ms: float | None = None       # the target's weight-read floor
    draft_floor_ms: float | None = None
    draft_curve_ms: tuple[float, ...] = ()   # [w - 1]: the draft scoring w tokens (when asked for)
    floor_bytes: int = 0                # what the floors count (target, draft)
    draft_floor_bytes: int = 0

    def verify_ratio(self) -> list[float]:
        """Cost of scoring k+1 tokens against one, k = 0..γ."""
        return [v / self.verify_ms[0] for v in self.verify_ms]

    def node_ms(self, nodes: int) -> float | None:
        """The verification cost of a tree of `nodes` nodes (None: not profiled that wide)."""
        return self.verify_ms[nodes] if nodes < len(self.verify_ms) else None

    def to_json(self) -> dict:
        out = {"verify_ms": list(self.verify_ms), "verify_ratio": self.verify_ratio(),
               "draft_ms_per_token": self.draft_ms_per_token, "floor_ms": self.floor_ms,
               "draft_floor_ms": self.draft_floor_ms, "floor_bytes": self.floor_bytes,
               "draft_floor_bytes": self.draft_floor_bytes}
        if self.draft_curve_ms:
            out["draft_curve_ms"] = list(self.draft_curve_ms)
        return out


def _forward_ms(lm, ids: torch.Tensor) -> float:
    """ms of scoring ids [1, w] after the cached prefix; the cache is cropped back after."""
    import torch

    base, sync = lm.cache_len, lm.device.type == "cuda"
    if sync:
        torch.cuda.synchronize(lm.device)
    t0 = time.perf_counter()
    lm.forward(ids)
    if sync:
        torch.cuda.synchronize(lm.device)
    ms = (time.perf_counter() - t0) * 1e3
    lm.crop(base)
    return ms


def profile_costs(target, draft, prompt: Sequence[int], gamma: int, reps: int = 7,
                  draft_widths: int = 1, nodes: int = 0) -> CostProfile:
    """Profile the target at widths 1..max(γ, nodes)+1 (nodes: the tree budget, `--tree-nodes`)
    and the draft at widths 1..draft_widths (CausalLMs; draft may be None) after `prompt`, and
    each one's weight-read floor: the widths and the read are interleaved rep by rep, so that a
    busy spell of a shared machine lands on all of them, and each keeps its fastest rep (the
    first is a warm-up). Leaves both caches reset."""
    import torch

    from drift_cli.engine import floor

    ids = torch.tensor([list(prompt)], dtype=torch.long, device=target.device)
    widest = max(gamma, nodes) + 1
    feed = ids[:, -1:].repeat(1, max(widest, draft_widths))
    out, floors, sizes = [], [], []
    for lm, widths in ((target, range(1, widest + 1)), (draft, range(1, draft_widths + 1))):
        if lm is None:
            out.append([0.0])
            floors.append(None)
            sizes.append(0)
            continue
        tensors = floor.read_tensors(lm)
        lm.reset()
        lm.forward(ids[:, :-1] if ids.shape[1] > 1 else ids)
        times = [[_forward_ms(lm, feed[:, :w]) for w in widths] + [floor.read_ms(tensors)]
                 for _ in range(reps + 1)][1:]
        best = [min(col) for col in zip(*times, strict=True)]
        out.append(best[:-1])
        floors.append(best[-1])
        sizes.append(floor.read_bytes(tensors))
        lm.reset()
    return CostProfile(tuple(out[0]), out[1][0], floors[0], floors[1],
                       tuple(out[1]) if draft_widths > 1 else (), sizes[0], sizes[1])


class GammaController:
    """`fixed`, and the interface of every controller."""

    name = "fixed"
    p_min: float | None = None          # set: the draft stops below this top probability

    def __init__(self, gamma_max: int, nodes_max: int = 0) -> None:
        self.gamma_max = gamma_max
        self.gamma = gamma_max
        self.nodes_max = self.nodes = nodes_max      # trees: the node budget (--tree-nodes); 0: chains

    def next_gamma(self) -> int:
        """γ for the next iteration, 0..gamma_max (the loop also cuts it at the generation budget)."""
        return self.gamma

    def next_nodes(self) -> int:
        """Trees: the node budget for the next iteration, 1..nodes_max (0 for chains)."""
        return self.nodes

    def observe(self, drafted: int, accepted: int, top_probs: Sequence[float] = (), record: Any = None) -> None:
        """The iteration's feedback: tokens drafted and accepted, the draft's top probability at
        each drafted position (confidence only) and its StepRecord (timings)."""

    def report(self) -> dict[str, Any]:
        return {}


class Transformers(GammaController):
    """+2 when every draft was accepted, −1 otherwise (transformers' `num_assistant_tokens`
    heuristic schedule), within 1..gamma_max. An iteration that drafted nothing changes nothing."""

    name = "hf"

    def observe(self, drafted, accepted, top_probs=(), record=None) -> None:
        if drafted:
            step = 2 if accepted == drafted else -1
            self.gamma = max(1, min(self.gamma_max, self.gamma + step))


def tiers(gamma_max: int) -> list[int]:
    """1, 2, 4, 8, ... below gamma_max, then gamma_max."""
    out = [1]
    while out[-1] * 2 < gamma_max:
        out.append(out[-1] * 2)
    return sorted(set(out) | {gamma_max})


class Tiered(GammaController):
    """An EMA of accepted drafts per iteration (starting at gamma_max); γ = the smallest tier of
    at least round(EMA) + 1 (one more than the expected accepted length, halves rounded up)."""

    name = "ema"

    def __init__(self, gamma_max: int, rate: float) -> None:
        super().__init__(gamma_max)
        self.rate, self.ema, self.tiers = rate, float(gamma_max), tiers(gamma_max)

    def observe(self, drafted, accepted, top_probs=(), record=None) -> None:
        if drafted:
            self.ema = (1 - self.rate) * self.ema + self.rate * accepted
            want = math.floor(self.ema + 0.5) + 1
            self.gamma = next((t for t in self.tiers if t >= want), self.gamma_max)


class Confidence(GammaController):
    """γ = gamma_max; the draft policy stops below p_min (`ModelDraftPolicy.propose`)."""

    name = "confidence"

    def __init__(self, gamma_max: int, p_min: float) -> None:
        super().__init__(gamma_max)
        self.p_min = p_min

    def report(self) -> dict[str, Any]:
        return {"p_min": self.p_min}


class CostModel(GammaController):
    """Maximise expected emitted tokens per ms (`metrics.goodput`) over γ = 0..gamma_max.

    α by position: decayed counts per position with shrinkage toward the previous position's
    estimate (position 1 toward 1/2), so an unexplored position borrows its neighbour's α and
    decay slowly re-opens a γ the controller stopped trying. Costs: scoring k+1 tokens costs the
    profile's ratio (k+1 tokens against one) times the one-token cost, which, with the draft's
    cost per token and the time outside the models, follows the stream's own step records (EMA).

    Trees (nodes_max > 0): γ (the depth) and the node budget n <= nodes_max together, maximising
    (`metrics.expected_tree_emitted` of the best n-node tree of depth γ) / (γ draft steps + the
    cost of scoring n + 1 tokens + the time outside the models). The acceptance of the child of
    sibling rank r at depth d, given its parent accepted and its elder siblings rejected, is
    estimated from decayed counts per (d, r) (each step's accepted ranks and the children tried
    below its path), with shrinkage toward (d, r-1), and for rank 0 toward (d-1, 0) (depth 1
    toward 1/2). The draft's cost is per depth (one forward per depth), from the steps' draft time
    over their γ."""

    name = "cost"
    PRIOR = 2.0        # pseudo-observations behind each position's shrinkage
    COST_RATE = 0.1    # EMA weight of a new timing measurement

    def __init__(self, gamma_max: int, profile: CostProfile, decay: float, nodes_max: int = 0, ranks: int = 4) -> None:
        super().__init__(gamma_max, nodes_max)
        self.decay = decay
        self.accepted = [0.0] * gamma_max
        self.drafted = [0.0] * gamma_max
        self.ratio = profile.verify_ratio()[: max(gamma_max, nodes_max) + 1]
        self.one_token_ms = profile.verify_ms[0]
        self.draft_ms = profile.draft_ms_per_token
        self.overhead_ms = 0.0
        # trees: decayed (tried, accepted) per depth 1..gamma_max and sibling rank 0..ranks-1
        self.tried = [[0.0] * ranks for _ in range(gamma_max)]
        self.hit = [[0.0] * ranks for _ in range(gamma_max)]
        self.gamma, self.nodes = self._best_tree() if nodes_max else (self._best(), 0)
        self.budgets: dict[int, int] = {}       # trees: iterations by the node budget chosen

    def next_nodes(self) -> int:
        self.budgets[self.nodes] = self.budgets.get(self.nodes, 0) + 1
        return self.nodes

    def alphas(self) -> list[float]:
        out, prev = [], 0.5
        for a, d in zip(self.accepted, self.drafted, strict=True):
            prev = (a + self.PRIOR * prev) / (d + self.PRIOR)
            out.append(prev)
        return out

    def verify_ms(self) -> list[float]:
        return [r * self.one_token_ms for r in self.ratio]

    def _best(self) -> int:
        from drift_cli import metrics

        alphas, verify = self.alphas(), self.verify_ms()
        rates = [metrics.goodput(alphas, k, self.draft_ms, verify, self.overhead_ms) for k in range(self.gamma_max + 1)]
        return max(range(len(rates)), key=lambda k: (rates[k], -k))

    def tree_alphas(self) -> list[list[float]]:
        """[d - 1][r]: the estimated acceptance of the rank-r child at depth d (see the class)."""
        out: list[list[float]] = []
        for d, (tried, hit) in enumerate(zip(self.tried, self.hit, strict=True)):
            row: list[float] = []
            for r, (t, h) in enumerate(zip(tried, hit, strict=True)):
                prior = row[r - 1] if r else (out[d - 1][0] if d else 0.5)
                row.append((h + self.PRIOR * prior) / (t + self.PRIOR))
            out.append(row)
        return out

    def _best_tree(self) -> tuple[int, int]:
        """(γ, n) of the highest expected tokens per ms; (0, nodes) when drafting does not pay."""
        from drift_cli import metrics

        accept, verify = self.tree_alphas(), self.verify_ms()
        best, choice = 1.0 / metrics.iteration_ms(0, self.draft_ms, verify, self.overhead_ms), (0, self.nodes)
        for k in range(1, self.gamma_max + 1):
            emitted = metrics.expected_tree_emitted(accept, k, self.nodes_max)
            for n in range(1, self.nodes_max + 1):
                rate = emitted[n] / metrics.iteration_ms(k, self.draft_ms, verify, self.overhead_ms, nodes=n)
                if rate > best:
                    best, choice = rate, (k, n)
        return choice

    def _observe_tree(self, record: Any) -> None:
        """One tree step's acceptance by (depth, rank): each accepted node's rank r at its depth
        (ranks 0..r tried, r accepted), then the children tried below the path (all rejected)."""
        for rows in (self.tried, self.hit):
            for row in rows:
                row[:] = [x * self.decay for x in row]
        ranks = len(self.tried[0])
        for d, r in enumerate(record.ranks[:self.gamma_max]):
            for j in range(min(r + 1, ranks)):
                self.tried[d][j] += 1.0
            if r < ranks:
                self.hit[d][r] += 1.0
        d = len(record.ranks)
        if d < self.gamma_max:
            for j in range(min(record.tried, ranks)):
                self.tried[d][j] += 1.0

    def _ema(self, old: float, new: float) -> float:
        return (1 - self.COST_RATE) * old + self.COST_RATE * new

    def observe(self, drafted, accepted, top_probs=(), record=None) -> None:
        tree = self.nodes_max > 0 and record is not None and record.nodes > 0
        self.accepted = [a * self.decay for a in self.accepted]
        self.drafted = [d * self.decay for d in self.drafted]
        for i in range(drafted):
            self.drafted[i] += 1.0
            self.accepted[i] += float(accepted > i)
        if tree:
            self._observe_tree(record)
        if record is not None:
            from drift_cli import metrics

            steps = record.gamma if tree else drafted       # a tree: one draft forward per depth
            if steps:
                self.draft_ms = self._ema(self.draft_ms, record.draft_ms / steps)
            width = min(record.nodes if tree else drafted, len(self.ratio) - 1)
            self.one_token_ms = self._ema(self.one_token_ms, record.forward_target_ms / self.ratio[width])
            self.overhead_ms = self._ema(self.overhead_ms, metrics.iteration_overhead_ms(record))
        if self.nodes_max:
            self.gamma, self.nodes = self._best_tree()
        else:
            self.gamma = self._best()

    def report(self) -> dict[str, Any]:
        out = {"alpha_by_position_estimate": self.alphas(), "draft_ms_per_token": self.draft_ms,
               "verify_ms": self.verify_ms(), "overhead_ms": self.overhead_ms}
        if self.nodes_max:
            out["acceptance_by_depth_rank_estimate"] = self.tree_alphas()
            out["node_budget_histogram"] = {str(n): c for n, c in sorted(self.budgets.items())}
        return out


def controller(cfg: GammaConfig, gamma_max: int, profile: CostProfile | None = None, nodes: int = 0,
               ranks: int = 4) -> GammaController:
    """A fresh controller for one stream (nodes: --tree-nodes, 0 for chains; ranks: --tree-branch)."""
    if cfg.policy == "hf":
        out: GammaController = Transformers(gamma_max)
    elif cfg.policy == "ema":
        out = Tiered(gamma_max, cfg.ema_rate)
    elif cfg.policy == "confidence":
        out = Confidence(gamma_max, cfg.p_min)
    elif cfg.policy == "cost":
        assert profile is not None, "the cost controller needs a CostProfile"
        return CostModel(gamma_max, profile, cfg.decay, nodes, ranks)
    else:
        out = GammaController(gamma_max)
    out.nodes_max = out.nodes = nodes
    return out
