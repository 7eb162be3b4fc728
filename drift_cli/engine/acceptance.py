"""The acceptance rule (Leviathan et al. 2023), the only place it is written.

Greedy: accept while each drafted token equals the target's argmax; emit the target's argmax at
the first mismatch (the correction) or after the last drafted token (the bonus).

Sampling: accept x_t with probability min(1, p_t(x_t) / q_t(x_t)), where q_t is the distribution
x_t was actually drawn from (a biased one for DRIFT); at the first rejection draw from
norm(max(p_t - q_t, 0)); when all k are accepted draw the bonus from p_{k+1}. A point-mass
proposal (model-free drafters) is q_t = one_hot(x_t): acceptance with probability p_t(x_t),
and the residual is p_t with x_t removed.

Ragged batches: tokens [B, k] with num_draft [B] (row b drafted its first num_draft[b] <= k
tokens; the rest of its row is padding). Row b's target distributions sit at [b, 0..num_draft[b]]
(the one after its last drafted token is its bonus); padded positions are never accepted, and a
row with num_draft 0 just takes the target's token. num_draft None means every row drafted k.
"""

from __future__ import annotations

import torch

from drift_cli.engine.tree import ROOT, children


def accepted_prefix(ok: torch.Tensor) -> torch.Tensor:
    """ok: [B, k] bool per position -> [B] length of the all-true prefix."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def drafted_mask(tokens: torch.Tensor, num_draft: torch.Tensor | None) -> torch.Tensor | None:
    """[B, k] True at the positions each row drafted (None: all of them)."""
    if num_draft is None:
        return None
    return torch.arange(tokens.shape[1], device=tokens.device) < num_draft.to(tokens.device)[:, None]


def accept_greedy(tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, k], target_logits [B, k+1, V], num_draft [B] or None -> (accepted [B], next_token [B])."""
    k = tokens.shape[1]
    best = target_logits.argmax(dim=-1)                     # [B, k+1]
    ok = tokens == best[:, :k]
    drafted = drafted_mask(tokens, num_draft)
    if drafted is not None:
        ok &= drafted
    accepted = accepted_prefix(ok)                          # [B]
    next_token = best.gather(1, accepted[:, None]).squeeze(1)
    return accepted, next_token


def accept_sampling(
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
    num_draft: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, k]; q [B, k, V] proposal probs (None: point mass); p [B, k+1, V] target probs;
    num_draft [B] or None (every row drafted k).

    Returns (accepted [B], next_token [B]).
    """
    b, k = tokens.shape
    if q is None:
        q = torch.zeros_like(p[:, :k]).scatter_(-1, tokens[..., None], 1.0)
    drafted = drafted_mask(tokens, num_draft)
    if drafted is not None:
        q = q * drafted[..., None]                            # a padded position proposes nothing
    px = p[:, :k].gather(-1, tokens[..., None]).squeeze(-1)   # [B, k]
    qx = q.gather(-1, tokens[..., None]).squeeze(-1)          # [B, k], > 0: x was drawn from q
    u = torch.rand((b, k), generator=generator, device=p.device)
    ok = u * qx < px                                          # u < p/q, i.e. prob min(1, p/q)
    if drafted is not None:
        ok &= drafted
    accepted = accepted_prefix(ok)
    # Row n of p holds the distribution after n accepted tokens; pad q with a zero row so that
    # when all of a row's drafts are accepted the "residual" is its next p itself (the bonus;
    # a ragged row's q is zero past its drafts already).
    q_pad = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)  # [B, k+1, V]
    idx = accepted[:, None, None].expand(-1, 1, p.shape[-1])
    residual = (p.gather(1, idx) - q_pad.gather(1, idx)).squeeze(1).clamp_(min=0)  # [B, V]
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 only when p == q at the rejected position, where rejection has probability 0.
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p.gather(1, idx).squeeze(1))
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, next_token


# -- trees (drift_cli.engine.tree) -----------------------------------------------------------------
#
# Greedy: from the root, follow the child whose token is the target's argmax; emit the argmax at
# the first node none of whose children matches.
#
# Sampling (the multi-candidate rule of SpecInfer, with siblings drawn without replacement as in
# recursive rejection sampling): at a node with target distribution p, let r = p and try its
# children c_1, c_2, ... in sibling order. Child c_i holds x_i, drawn from q_i: its parent's
# proposal q with the elder siblings' tokens removed and renormalised (a point mass when the
# drafter chose it deterministically). Accept c_i with probability min(1, r(x_i) / q_i(x_i)) and
# descend into it; on rejection r <- norm(max(r - q_i, 0)). When every child is rejected (or the
# node is a leaf) the next token is drawn from r. A chain is the tree with one child per node, and
# then this is exactly `accept_sampling`, with the same random numbers: one uniform per node
# ([B, N] drawn at once), one multinomial over all rows' final distributions.


def accept_tree_greedy(tokens: torch.Tensor, parents: list[list[int]],
                       target_logits: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """tokens [B, N]; parents per row; target_logits [B, N+1, V] (index 0: the root, i + 1: node i).

    Returns (accepted path per row: node indices from the root down, next_token [B])."""
    best = target_logits.argmax(dim=-1)                    # [B, N+1]
    host, toks = best.tolist(), tokens.tolist()
    paths, nxt = [], []
    for b, par in enumerate(parents):
        kids, path, at = children(par), [], ROOT
        while True:
            want = host[b][at + 1]
            hit = next((c for c in kids[at + 1] if toks[b][c] == want), None)
            if hit is None:
                break
            path.append(hit)
            at = hit
        paths.append(path)
        nxt.append(host[b][at + 1])
    return paths, torch.tensor(nxt, dtype=torch.long, device=target_logits.device)


def accept_tree_sampling(tokens: torch.Tensor, parents: list[list[int]], q: torch.Tensor | None, p: torch.Tensor,
                         generator: torch.Generator | None = None,
                         against_p: bool = False) -> tuple[list[list[int]], torch.Tensor]:
    """tokens [B, N]; parents per row; q [B, N, V] each node's proposal before sibling removal (None:
    point masses); p [B, N+1, V] target probs (index 0: the root, i + 1: node i).

    Returns (accepted path per row, next_token [B]). against_p: a deliberately wrong rule for the
    tests (each sibling tried against p instead of the residual); never used by the engine."""
    b, n = tokens.shape
    u = torch.rand((b, n), generator=generator, device=p.device)
    toks = tokens.tolist()
    paths, finals = [], []
    for row, par in enumerate(parents):
        kids, path, at = children(par), [], ROOT
        r, fresh = p[row, 0], True          # fresh: r is the node's p itself, no sibling rejected
        while True:
            hit, removed = None, []
            for c in kids[at + 1]:
                x = toks[row][c]
                qc = _sibling_q(q, row, c, x, removed, r)
                if float(u[row, c] * qc[x]) < float((p[row, at + 1] if against_p else r)[x]):
                    hit = c
                    break
                r, fresh = _residual(r, qc), False
                removed.append(x)
            if hit is None:
                break
            path.append(hit)
            at = hit
            r, fresh = p[row, at + 1], True
        paths.append(path)
        finals.append(r / r.sum() if fresh else r)          # the bonus, normalised as `accept_sampling` does
    next_token = torch.multinomial(torch.stack(finals), 1, generator=generator).squeeze(1)
    return paths, next_token


def _sibling_q(q: torch.Tensor | None, row: int, node: int, x: int, removed: list[int],
               like: torch.Tensor) -> torch.Tensor:
    """The distribution sibling `node` (token x) was drawn from: its parent's proposal without the
    elder siblings' tokens, renormalised; a point mass at x when q is None."""
    if q is None:
        return torch.zeros_like(like).index_fill_(0, torch.tensor([x], device=like.device), 1.0)
    qc = q[row, node]
    if removed:
        qc = qc.index_fill(0, torch.tensor(removed, device=qc.device), 0.0)
        qc = qc / qc.sum()
    return qc


def _residual(r: torch.Tensor, qc: torch.Tensor) -> torch.Tensor:
    """norm(max(r - q, 0)); r itself when that has no mass (r == q: rejection had probability 0)."""
    res = (r - qc).clamp_(min=0)
    mass = res.sum()
    return res / mass if mass > 0 else r
