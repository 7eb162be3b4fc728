"""A head as the draft LM of `ModelDraftPolicy`: `CausalLM`'s row interface over (state, token) pairs.

The head's cache position i holds the pair (g_i, x_{i+1}): the target's state at position i (or,
while drafting, the head's own carry) and the next token. Per row the drafter keeps:
  * `pairs` (the `RowCache` length): entries in the head's cache, positions 0..pairs-1;
  * `real`: how many of them were fed with the target's own states (a prefix of them);
  * the target states known so far (`add_features`): the row's committed positions but the last,
    in order, as the engine hands them over (the prompt's, then each commit's). They are kept
    whole: OSD's buffer reads its contexts' states from them and a re-prefill needs them;
  * the carry of its last fed position (the state the next drafted position reads).

`row_len(slot)` is pairs + 1, the committed prefix the cache covers (pair i covers x_{i+1}), so that
the policy's feed `ids[row_len:]` is exactly the tokens of the pairs the head lacks, and its cache
invariant reads as for a draft model: after a commit the cache covers at most the committed
sequence minus its last token.

Rollback (`crop_rows`) keeps min(real, committed - 2) pairs per row: the entries a draft step
computed from the head's own carry are dropped whatever was accepted (their state was
predicted, not the target's), the real ones stay. The next propose feeds the pairs that became
known (the previous last token and the accepted drafts with the target's states from
verification) in its first draft step, batched with the other rows'. Never a re-prefill.

Trees (`--tree-nodes`, `drift_cli.methods.tree_draft`): after that first step, each depth's
nodes go through `forward_nodes` with a tree mask, node j reading its parent's carry at position
committed + depth - 1, written after the row's real pairs. None of them is real, so after
verification `keep_rows` keeps none of them (the accepted path's pairs included, exactly as
`crop_rows` drops a chain's accepted drafts): the real prefix is already in place, and the path's
pairs come back with the target's states in the next first draft step.
"""

from __future__ import annotations

import torch

from drift_cli.eagle.modules import EagleHead
from drift_cli.engine import cpu_linear
from drift_cli.engine.head import OutputHead
from drift_cli.engine.lm import RowCache
from drift_cli.engine.timing import IterationClock, NullClock


class HeadDrafter:
    def __init__(self, head: EagleHead, name: str = "draft") -> None:
        self.model = head.eval()
        self.name = name
        cpu_linear.install(head)                 # CPU fp32 inference: the skinny GEMM (once, here)
        self.head = OutputHead(head)
        self.target_layers = head.target_layers
        self.feature_dim = head.feature_dim
        self.clock: IterationClock = NullClock()
        self.forward_calls = 0
        self.reset_rows(1)

    @property
    def device(self) -> torch.device:
        return self.head.linear.weight.device

    @property
    def vocab_size(self) -> int:
        return self.head.vocab_size

    # -- rows ------------------------------------------------------------------------------------

    def reset_rows(self, slots: int, row_cache: bool = True) -> None:
        """Empty caches and feature histories for `slots` rows (batch 1 too: one path for all, a
        `RowCache` always, which is what trees need)."""
        n = max(1, slots)
        self.rows = RowCache(n)
        self.real = [0] * n
        self.known = [0] * n
        self._features: list[torch.Tensor | None] = [None] * n
        self._carry: list[torch.Tensor | None] = [None] * n

    def reset(self) -> None:
        self.reset_rows(1)

    def reset_row(self, slot: int) -> None:
        """A new prompt takes the slot: an empty cache and no target states (a new history buffer:
        views of the old one, in OSD's buffer, stay as they were)."""
        self.rows.lengths[slot] = 0
        self.real[slot] = self.known[slot] = 0
        self._features[slot] = self._carry[slot] = None

    def row_len(self, slot: int) -> int:
        return self.rows.lengths[slot] + 1

    def add_features(self, slot: int, features: torch.Tensor | None) -> None:
        """Append the target's states [e, F] at the row's next committed positions."""
        if features is None or features.shape[0] == 0:
            return
        n, e = self.known[slot], features.shape[0]
        buf = self._features[slot]
        if buf is None or buf.shape[0] < n + e:
            grown = features.new_empty(max(64, n + e, 2 * (0 if buf is None else buf.shape[0])), features.shape[1])
            if buf is not None:
                grown[:n] = buf[:n]
            buf = self._features[slot] = grown
        buf[n:n + e] = features
        self.known[slot] = n + e

    def features(self, slot: int, n: int | None = None) -> torch.Tensor:
        """The row's first n known target states [n, F] (a view; all of them by default)."""
        n = self.known[slot] if n is None else n
        buf = self._features[slot]
        if buf is None:
            return torch.zeros(0, self.feature_dim, device=self.device)
        return buf[:n]

    def context_features(self, slot: int, committed: int, scored: torch.Tensor) -> torch.Tensor:
        """The target's states over a context: the row's first `committed` known ones, then
        `scored` [j, F] (verification's, at the positions after them). A view of the row's history
        when it holds them already (the accepted positions), else a copy."""
        j = scored.shape[0]
        if committed + j <= self.known[slot]:
            return self.features(slot, committed + j)
        return torch.cat([self.features(slot, committed), scored.to(self.device)])

    def crop_rows(self, slots: list[int], lengths: list[int]) -> None:
        """Each row keeps its real pairs within its committed prefix: min(real, length - 1)."""
        for s, n in zip(slots, lengths, strict=True):
            keep = max(0, min(self.rows.lengths[s], self.real[s], n - 1))
            self.rows.lengths[s] = self.real[s] = keep

    @torch.inference_mode()
    def refill_row(self, slot: int, ids: torch.Tensor) -> None:
        """Recompute a row's cache from its known states over its committed ids [L] (after a
        change of the head's weights, never after a rollback): the pairs but the last as keys and
        values alone (`EagleHead.fill`), the last one whole, for the carry the next draft reads."""
        self.rows.lengths[slot] = self.real[slot] = 0
        self._carry[slot] = None
        if len(ids) > 3:
            feed = ids[1:-2]
            g = self._states([slot], [0], [len(feed)], len(feed))
            self._forward([slot], feed[None], [len(feed)], g, fill=True)
            self.real[slot] = len(feed)                # every one of them fed the target's state
        if len(ids) > 2:
            self.forward_rows([slot], [ids[-2:-1]])

    # -- the forward -----------------------------------------------------------------------------

    def _states(self, slots: list[int], start: list[int], sizes: list[int], width: int) -> torch.Tensor:
        """The g [R, S, d] each fed position reads: the fused target state where it is known,
        the row's carry at its first position past them (drafting). A later position without a
        target state would read a state nobody computed: refused."""
        d = self.model.config.hidden_size
        real = [max(0, min(n, self.known[s] - p)) for s, p, n in zip(slots, start, sizes, strict=True)]
        if any(real):
            raw = torch.zeros(len(slots), width, self.feature_dim, device=self.device, dtype=self.head.linear.weight.dtype)
            for i, (s, p, m) in enumerate(zip(slots, start, real, strict=True)):
                if m:
                    raw[i, :m] = self._features[s][p:p + m]
            g = self.model.fuse(raw)
        else:
            g = torch.zeros(len(slots), width, d, device=self.device, dtype=self.head.linear.weight.dtype)
        for i, (s, m, n) in enumerate(zip(slots, real, sizes, strict=True)):
            if m < n:
                if n - m > 1:
                    raise ValueError(f"row {s}: positions {start[i] + m + 1}..{start[i] + n - 1} have no target state")
                if self._carry[s] is not None:
                    g[i, m] = self._carry[s]
        return g

    @torch.inference_mode()
    def forward_rows(self, slots: list[int], feeds: list[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row its next tokens (x_{i+1} of pairs i = pairs, pairs+1, ...), all rows in one
        pass; a row may feed none (it has no pair yet: a one-token prompt). Returns (hidden [R, S, d],
        logits [R, S, V]) as `CausalLM.forward_rows` does."""
        ids, sizes = self._pad(feeds)
        start = [self.rows.lengths[s] for s in slots]
        g = self._states(slots, start, sizes, ids.shape[1])
        hidden, logits, carry = self._forward(slots, ids, sizes, g)
        for i, (s, p, n) in enumerate(zip(slots, start, sizes, strict=True)):
            if self.real[s] == p:                       # a real prefix grows by the real positions fed
                self.real[s] += max(0, min(n, self.known[s] - p))
            self._carry[s] = carry[i, max(n, 1) - 1]
        return hidden, logits

    @torch.inference_mode()
    def forward_nodes(self, slots: list[int], feeds: list[torch.Tensor], states: torch.Tensor,
                      attend) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A tree's nodes (`drift_cli.methods.tree_draft`): row i feeds feeds[i] at its next cache
        slots, node j reading the state states[i, j] (its parent's carry) and attending as
        `attend` (a `drift_cli.engine.tree.Attention`: its ancestors and the committed prefix, at
        position committed + depth - 1) says. Nothing fed is real and the rows' carries stay as
        they were. Returns (hidden, logits, carry), each [R, S, ...]."""
        ids, sizes = self._pad(feeds)
        return self._forward(slots, ids, sizes, states, attend)

    def carry(self, slot: int) -> torch.Tensor:
        """The carry [d] of the row's last fed position (the state its next drafted position reads)."""
        return self._carry[slot]

    def keep_rows(self, slots: list[int], sources: list[list[int]], starts: list[int]) -> None:
        """After a tree (`CausalLM.keep_rows`' interface): every node was fed the head's own carry,
        not the target's state, so none of the accepted path's entries is kept, as after a chain
        (`crop_rows`): each row keeps its real pairs, already in place below starts[i]. The path's
        pairs come back, with the target's states, in the next first draft step."""
        for s, start in zip(slots, starts, strict=True):
            self.rows.lengths[s] = min(self.rows.lengths[s], start, self.real[s])

    def _pad(self, feeds: list[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        if isinstance(feeds, torch.Tensor):
            return feeds, [feeds.shape[1]] * feeds.shape[0]
        sizes = [len(f) for f in feeds]
        ids = torch.zeros(len(feeds), max(1, max(sizes)), dtype=torch.long, device=self.device)
        for i, f in enumerate(feeds):
            ids[i, :len(f)] = f
        return ids, sizes

    def _forward(self, slots: list[int], ids: torch.Tensor, sizes: list[int], g: torch.Tensor, attend=None,
                 fill: bool = False):
        """ids [R, S] with states g [R, S, d] at the rows' next cache slots, causal (position = slot)
        or as `attend` says -> (hidden, logits, carry); the rows' lengths grow by their sizes.
        fill: the keys/values alone (a re-prefill), returns None."""
        cache, device = self.rows, self.device
        width = ids.shape[1]
        start = [cache.lengths[s] for s in slots]
        slot_ids = torch.tensor(start, device=device)[:, None] + torch.arange(width, device=device)   # [R, S]
        kv_len = max(start) + width
        cache.begin(slots, slot_ids, kv_len)
        if attend is None:
            pos, visible = slot_ids, torch.arange(kv_len, device=device) <= slot_ids[..., None]       # [R, S, kv_len]
        else:
            pos, visible = attend.positions, attend.visible
        dtype = g.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
        with self.clock.span(f"forward_{self.name}"):
            if fill:
                self.model.fill(ids.to(device), g, pos, mask[:, None], cache)
            else:
                hidden, carry, _ = self.model(ids.to(device), g, pos, mask[:, None], cache=cache)
                logits = self.head(hidden)
        for s, p, n in zip(slots, start, sizes, strict=True):
            cache.lengths[s] = p + n
        self.forward_calls += 1
        return None if fill else (hidden, logits, carry)

    # -- batch 1, the cost probe of `profile_costs` (`CausalLM`'s reset / forward / crop) ---------

    @property
    def cache_len(self) -> int:
        return self.rows.lengths[0]

    def crop(self, length: int) -> None:
        self.rows.lengths[0] = self.real[0] = min(self.rows.lengths[0], length)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1, S] after row 0's cache, positions without a target state given zero states
        (the operations of a draft step, not its values)."""
        missing = self.rows.lengths[0] + ids.shape[1] - self.known[0]
        if missing > 0:
            self.add_features(0, torch.zeros(missing, self.feature_dim, device=self.device,
                                             dtype=self.head.linear.weight.dtype))
        return self.forward_rows([0], [ids[0]])
