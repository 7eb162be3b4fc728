"""A causal LM with a KV cache that rolls back by cropping.

Wraps any Hugging Face causal LM that exposes a decoder (`get_decoder()`) and an output
embedding (`get_output_embeddings()`): the decoder's last hidden state is exactly the input to
`lm_head`, which DRIFT keys on. A draft with a vocabulary subset scores only its subset
(`drift_cli.engine.head`). The cache is never re-prefilled after a rejection: it is cropped.

transformers 5.x renamed the forward argument `past_key_values` to `cache` and made
`DynamicCache.crop` take a negative count of tokens to drop; `_cache_kwarg` and `_drop` adapt to
the installed version (tested on 5.17 and the newest release).

Batches (`reset_rows(n)` with n > 1) use `RowCache`, a cache of our own with one committed length
per row: row b's new keys/values are written at its own positions, its attention mask and
position ids follow its own length, and rolling a row back is setting its length (the entries
past it are overwritten by its next forward). n = 1 keeps the `DynamicCache` path, so batch 1
runs exactly the operations it always ran. docs/engine.md has the choice and its cost.

A drafter that reads the target's hidden states (an EAGLE head, docs/eagle.md) has them recorded
during the passes the engine runs anyway: `capture(layers)` hooks the decoder layers, and every
forward then leaves `features` behind. Nothing is hooked unless a drafter asks.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from drift_cli.engine import cpu_linear, lean
from drift_cli.engine.head import OutputHead
from drift_cli.engine.timing import IterationClock, NullClock


def _cache_kwarg(decoder: torch.nn.Module) -> str:
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _drop(cache: DynamicCache, n: int) -> None:
    """Drop the last n positions from every layer of the cache."""
    if n > 0:
        cache.crop(-n)


def pad_feeds(feeds: list[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Ragged feeds (1-D ids per row, or a [R, S] tensor) -> (ids [R, S] zero-padded, each row's length)."""
    if isinstance(feeds, torch.Tensor):
        return feeds, [feeds.shape[1]] * feeds.shape[0]
    sizes = [len(f) for f in feeds]
    ids = feeds[0].new_zeros(len(feeds), max(sizes))
    for i, f in enumerate(feeds):
        ids[i, :len(f)] = f
    return ids, sizes


class RowCache:
    """Keys/values [slots, heads, capacity, head_dim] per layer, one committed length per slot.

    The model calls `update` once per layer with the new keys [R, H, S, D] of the rows of the
    current forward (`begin` sets them: slot ids and write positions [R, S]); it returns the
    keys/values those rows attend over, [R, H, kv_len, D] with kv_len the longest row after the
    write. Everything a row may not see (other rows' lengths, its own stale tail) is masked by
    the 4D mask `CausalLM.forward_rows` passes, so stale entries never need clearing.
    Duck-typed on purpose: no transformers Cache subclass (its layer API moved within 5.x);
    the models only call `update` when handed a 4D mask and position ids.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.lengths = [0] * slots
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self._rows = self._pos = None
        self._all = True
        self._kv_len = 0

    def begin(self, slots: list[int], pos: torch.Tensor, kv_len: int) -> None:
        self._all = slots == list(range(self.slots))
        self._rows = torch.tensor(slots, device=pos.device)
        self._pos, self._kv_len = pos, kv_len

    def _buffer(self, store: list, layer: int, like: torch.Tensor) -> torch.Tensor:
        while len(store) <= layer:
            store.append(None)
        buf = store[layer]
        if buf is None or buf.shape[2] < self._kv_len:
            cap = max(64, self._kv_len, 2 * (0 if buf is None else buf.shape[2]))
            new = like.new_zeros(self.slots, like.shape[1], cap, like.shape[3])
            if buf is not None:
                new[:, :, :buf.shape[2]] = buf
            buf = store[layer] = new
        return buf

    def _write(self, store: list, layer: int, new: torch.Tensor) -> torch.Tensor:
        buf = self._buffer(store, layer, new)
        rows = self._rows[:, None]
        buf[rows, :, self._pos] = new.transpose(1, 2)          # [R, S, H, D] at (row, its positions)
        return buf[:, :, :self._kv_len] if self._all else buf[self._rows, :, :self._kv_len]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self._write(self.keys, layer_idx, key_states), self._write(self.values, layer_idx, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths)

    def keep(self, rows: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Move entries: (rows[i], sources[i]) -> (rows[i], targets[i]) in every layer, in one
        gather per buffer (the sources are read before anything is written)."""
        for store in (self.keys, self.values):
            for buf in store:
                if buf is not None:
                    buf[rows, :, targets] = buf[rows, :, sources]


class CausalLM:
    """One model plus its KV cache. `cache_len` counts the positions the cache holds (batch 1);
    `row_len(slot)` a row's (any batch)."""

    def __init__(self, model: torch.nn.Module, name: str = "model") -> None:
        self.model = model.eval()
        self.name = name
        cpu_linear.install(model)                # CPU fp32 inference: the skinny GEMM (once, here)
        self.decoder = model.get_decoder()
        self.lean = lean.make(self.decoder)      # CPU fp32 Llama: the lean forward (None: transformers')
        self.head = OutputHead(model)
        self._kw = _cache_kwarg(self.decoder)
        self.cache: DynamicCache | lean.FlatCache | None = None
        self.cache_len = 0
        self.rows: RowCache | None = None        # set by reset_rows(n > 1)
        self.clock: IterationClock = NullClock()
        self.forward_calls = 0
        self.forward_tokens = 0                  # positions fed, padding included (a count, untimed)
        self.capture_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None   # [B, S, F] of the last forward, while capturing
        self._hooks: list = []
        self._captured: dict[int, torch.Tensor] = {}

    @property
    def device(self) -> torch.device:
        return self.head.linear.weight.device

    @property
    def vocab_size(self) -> int:
        return self.head.vocab_size

    def reset(self) -> None:
        self.cache = lean.FlatCache() if self.lean is not None else DynamicCache(config=self.model.config)
        self.cache_len = 0
        self.rows = None

    # -- target features: hidden states recorded during the passes that run anyway -------------

    @property
    def layers(self) -> int:
        """L, the decoder layers: hidden-state indices run from 0 (the embeddings) to L (the final state)."""
        return len(self.decoder.layers)

    def capture(self, layers: tuple[int, ...]) -> None:
        """Record, in every forward from now on, the hidden states at these Hugging Face
        hidden-state indices, concatenated in this order, into `features` [B, S, len(layers)·d]:
        index k < L is the input of decoder layer k (the output of layer k-1; 0: the embeddings),
        index L (or -1) the final, post-norm state that the lm_head reads. () stops recording.
        Forward pre-hooks on the decoder layers read what the pass computes anyway: no extra pass."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._captured, self.features = [], {}, None
        n = self.layers
        if any(not -1 <= k <= n for k in layers):
            raise ValueError(f"hidden-state indices {layers} outside 0..{n} (or -1) of a {n}-layer model")
        self.capture_layers = tuple(n if k == -1 else k for k in layers)
        for k in sorted({k for k in self.capture_layers if k < n}):
            self._hooks.append(self.decoder.layers[k].register_forward_pre_hook(self._recorder(k), with_kwargs=True))

    def _recorder(self, k: int):
        def record(module, args, kwargs):
            self._captured[k] = args[0] if args else kwargs["hidden_states"]
        return record

    def _collect(self, hidden: torch.Tensor) -> None:
        """After a forward: the recorded states (and the final one, `hidden`) as `features`."""
        if self.capture_layers:
            n = self.layers
            parts = [hidden if k == n else self._captured[k] for k in self.capture_layers]
            self.features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
            self._captured = {}

    # -- batches: one committed length per slot --------------------------------------------------

    def reset_rows(self, slots: int, row_cache: bool = False) -> None:
        """Empty caches for `slots` rows (1: the batch-1 `DynamicCache` path, unless row_cache:
        trees need the RowCache's 4D mask at every batch size)."""
        self.reset()
        if slots > 1 or row_cache:
            self.rows = RowCache(slots)

    def reset_row(self, slot: int) -> None:
        """Empty one row's cache (a new prompt takes the slot)."""
        if self.rows is None:
            self.reset()
        else:
            self.rows.lengths[slot] = 0

    def row_len(self, slot: int) -> int:
        return self.cache_len if self.rows is None else self.rows.lengths[slot]

    def refill_row(self, slot: int, ids: torch.Tensor) -> None:
        """Recompute a row's cache over its committed ids [L] (all but the last): after a change
        of the weights (OSD's update), never after a rollback."""
        self.reset_row(slot)
        if len(ids) > 1:
            self.forward_rows([slot], [ids[:-1]], logits=False)     # the keys/values, not the logits

    def crop_rows(self, slots: list[int], lengths: list[int]) -> None:
        """Roll each row back to its own committed length (never a re-prefill)."""
        if self.rows is None:
            self.crop(lengths[0])
            return
        for s, n in zip(slots, lengths, strict=True):
            self.rows.lengths[s] = min(self.rows.lengths[s], n)

    @torch.inference_mode()
    def keep_rows(self, slots: list[int], sources: list[list[int]], starts: list[int]) -> None:
        """After a tree: row slots[i]'s cache entries at positions sources[i] move to starts[i],
        starts[i] + 1, ..., and the row keeps starts[i] + len(sources[i]) positions. One gather."""
        assert self.rows is not None, "trees use the RowCache (reset_rows(n, row_cache=True))"
        rows, src, dst = [], [], []
        for slot, path, start in zip(slots, sources, starts, strict=True):
            rows += [slot] * len(path)
            src += path
            dst += range(start, start + len(path))
            self.rows.lengths[slot] = start + len(path)
        if src != dst:
            as_index = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
            self.rows.keep(as_index(rows), as_index(src), as_index(dst))

    @torch.inference_mode()
    def forward_rows(self, slots: list[int], feeds: list[torch.Tensor] | torch.Tensor,
                     attend=None, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run feeds[i] (1-D ids; or a [R, S] tensor: every row S ids) after row slots[i]'s
        cached prefix, all rows in one pass.

        Returns (hidden [R, S, d], logits [R, S, V]) with S the longest feed; row i's outputs
        are its first len(feeds[i]) positions (the rest is padding: computed, then rolled back).
        attend: a tree's `drift_cli.engine.tree.Attention` (positions, visibility) instead of the
        causal one; the feeds are still written at the rows' next cache slots.
        logits=False: the cache and the hidden states only (a re-prefill), logits None.
        """
        if self.rows is None:
            return self.forward(feeds if isinstance(feeds, torch.Tensor) else feeds[0][None], logits=logits)
        cache, device = self.rows, self.device
        ids, sizes = pad_feeds(feeds)
        s = ids.shape[1]
        start = torch.tensor([cache.lengths[slot] for slot in slots], device=device)
        pos = start[:, None] + torch.arange(s, device=device)                # [R, S] each row's own positions
        kv_len = int(start.max()) + s
        cache.begin(slots, pos, kv_len)
        # query (row, i) sees key j <= its own position; padding queries are finite tokens of the
        # row too (so no row of the softmax is empty), rolled back below
        if attend is None:
            visible = torch.arange(kv_len, device=device) <= pos[..., None]   # [R, S, kv_len]
        else:
            pos, visible = attend.positions, attend.visible
        dtype = self.head.linear.weight.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
        with self.clock.span(f"forward_{self.name}"):
            hidden = self._decode(ids.to(device), pos, cache, mask[:, None])
            out = self.head(hidden) if logits else None
            self._collect(hidden)
        for slot, n in zip(slots, sizes, strict=True):
            cache.lengths[slot] += n
        self.forward_calls += 1
        self.forward_tokens += ids.numel()
        return hidden, out

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ids [B, S] after the cached prefix; return (hidden [B, S, d], logits [B, S, V] fp32;
        None when not asked for)."""
        if self.cache is None:
            self.reset()
        s = ids.shape[1]
        pos = torch.arange(self.cache_len, self.cache_len + s, device=ids.device)
        if self.lean is not None:
            self.cache.begin(self.cache_len, s)
        with self.clock.span(f"forward_{self.name}"):
            hidden = self._decode(ids, pos.unsqueeze(0).expand(ids.shape[0], -1), self.cache, None)
            out = self.head(hidden) if logits else None
            self._collect(hidden)
        self.cache_len += s
        if self.lean is not None:
            self.cache.length = self.cache_len
        self.forward_calls += 1
        self.forward_tokens += ids.numel()
        return hidden, out

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """The decoder's last hidden state for ids [R, S] at positions [R, S] over `cache` (a 4D
        additive mask, or None: causal over exactly the cached prefix), by the lean forward where
        it serves this model, else transformers'; records the captured layers' inputs."""
        if self.lean is not None:
            hidden, self._captured = self.lean(ids, pos, cache, mask, self.capture_layers)
            return hidden
        kw = {} if mask is None else {"attention_mask": mask}
        return self.decoder(input_ids=ids, position_ids=pos, use_cache=True, **kw, **{self._kw: cache}).last_hidden_state

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions (no-op when the cache is already that short)."""
        if length < self.cache_len:
            if isinstance(self.cache, lean.FlatCache):
                self.cache.crop(length)
            else:
                _drop(self.cache, self.cache_len - length)
            self.cache_len = length
