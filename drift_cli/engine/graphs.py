"""The GPU step: a static, preallocated KV cache and one CUDA graph per forward width.

On CUDA an eager Hugging Face forward is host-bound: every k tokens scored cost about the same
launch-bound step, whatever the model (docs/engine.md, "The GPU step"). `StaticLM` is a
`CausalLM` whose KV cache never changes shape, so that a forward of width S (S tokens per row)
can be captured once as a CUDA graph and replayed:

  * `SlotCache`: per layer, keys/values [slots, kv_heads, capacity, head_dim], allocated once;
    capacity = `usable` positions rows may commit + `scratch` positions at the end that no row
    ever commits. A forward writes each row's new keys at its positions with one indexed copy,
    and every row attends over the whole capacity under a 4D mask built on the device from the
    position ids (query i of row b sees keys j <= its own position). Rolling a row back is
    setting its length, as with `RowCache`.
  * every forward runs all slots: a row that is not in the call (an empty slot, a one-row
    prefill) is fed at scratch positions, so one graph per width S serves every subset of rows.
  * a graph's inputs (ids, positions [slots, S]) are static buffers copied into before replay;
    its outputs (hidden, logits, captured target features) are static tensors, cloned after
    replay (the next replay overwrites them).

The cache buffers and the graphs of one model live in a registry keyed by (model, role name,
slots), so the draft LMs that successive methods build over the same draft model share the graphs
the warm-up captured. One LM at a time may use a (model, name, slots) entry: the engine runs
methods one after another.

Modes (`DRIFT_ENGINE`, read when an LM is made): `eager` (the `CausalLM` path, the CPU default),
`static` (the static cache, no graphs: proves on the CPU that it decodes the same tokens) and
`graph` (the CUDA default; on the CPU the graph is emulated by re-running the same function over
the same static buffers, which tests the buffer plumbing but not the capture).

Falls back to eager, and why: widths above `scratch` (prefills) run the static forward without a
graph (a prompt's length varies; it runs once per prompt); an EAGLE head's drafter keeps its own
`RowCache` path (its forward feeds per-row target states and carries: not a fixed shape here).
Hooks (`capture(layers)`) run during capture only: the features they record are static outputs of
the graph, so graphs are keyed by the captured layers too.
"""

from __future__ import annotations

import os
import time
import weakref

import torch

from drift_cli.engine.lm import CausalLM, pad_feeds

ENGINE_ENV = "DRIFT_ENGINE"
MODES = ("eager", "static", "graph")
ALIGN = 64                      # capacity rounded up to this (SDPA's mask stride likes 16-element alignment)
DEFAULT_USABLE = 256            # positions a row may commit before the cache grows (bench reserves the stream's)
DEFAULT_SCRATCH = 16            # widths 1..16 run as graphs (γ up to 15); wider forwards run without one


def engine_mode(device: torch.device | str) -> str:
    """The engine path for a model on `device`: $DRIFT_ENGINE if set, else graph on CUDA, eager elsewhere."""
    mode = os.environ.get(ENGINE_ENV, "").strip().lower()
    if mode:
        if mode not in MODES:
            from drift_cli.errors import BadInput

            raise BadInput(f"{ENGINE_ENV} must be one of {', '.join(MODES)} (got '{mode}')")
        return mode
    return "graph" if torch.device(device).type == "cuda" else "eager"


def make_lm(model: torch.nn.Module, name: str = "model", mode: str | None = None) -> CausalLM:
    """The `CausalLM` that drives `model` on its device: eager, static-cache or graph (`engine_mode`)."""
    device = model.get_output_embeddings().weight.device
    mode = mode or engine_mode(device)
    if mode == "eager":
        return CausalLM(model, name)
    return StaticLM(model, name, graphs=mode == "graph")


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


class SlotCache:
    """Keys/values [slots, heads, usable + scratch, head_dim] per layer, allocated on the first
    forward at that capacity and never reshaped (growing reallocates and drops the graphs).

    Duck-typed like `RowCache`: the model calls `update(key, value, layer_idx)` with the keys of
    all slots [slots, H, S, D]; they are written at `pos` [slots, S] (set before the forward) and
    the whole buffer comes back: rows attend over every position, masked.
    """

    def __init__(self, slots: int, usable: int, scratch: int) -> None:
        self.slots, self.usable, self.scratch = slots, usable, scratch
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.pos: torch.Tensor | None = None          # [rows, S] write positions of the current forward
        self.sel: torch.Tensor | None = None          # [rows] the slots of an eager forward of some rows (None: all)
        self.lengths: list[int] = [0] * slots       # the using LM's committed lengths (host)
        self._rows: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.usable + self.scratch

    def _buffer(self, store: list, layer: int, like: torch.Tensor) -> torch.Tensor:
        while len(store) <= layer:
            store.append(None)
        buf = store[layer]
        if buf is None or buf.shape[2] != self.capacity:
            new = like.new_zeros(self.slots, like.shape[1], self.capacity, like.shape[3])
            if buf is not None:                      # grown: committed positions carry over
                n = min(buf.shape[2], self.capacity)
                new[:, :, :n] = buf[:, :, :n]
            buf = store[layer] = new
        return buf

    def _write(self, store: list, layer: int, new: torch.Tensor) -> torch.Tensor:
        buf = self._buffer(store, layer, new)
        if self.sel is not None:                                     # an eager forward of some rows only
            buf[self.sel[:, None], :, self.pos] = new.transpose(1, 2)
            return buf[self.sel]
        if self._rows is None or self._rows.device != new.device:
            self._rows = torch.arange(self.slots, device=new.device)[:, None]
        buf[self._rows, :, self.pos] = new.transpose(1, 2)          # [slots, S, H, D] at (row, its positions)
        return buf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self._write(self.keys, layer_idx, key_states), self._write(self.values, layer_idx, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths)


class _Emulated:
    """The CPU stand-in of a captured graph: replay re-runs the function over the same static
    inputs and copies its results into the static outputs of the first run."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.outputs = fn()

    def replay(self) -> None:
        for static, new in zip(self.outputs, self.fn(), strict=True):
            if static is not None:
                static.copy_(new)


class _Captured:
    """One width's graph: static inputs ids/pos [slots, S] and static outputs."""

    def __init__(self, graph, ids: torch.Tensor, pos: torch.Tensor, outputs: tuple, state: "_State") -> None:
        self.graph, self.ids, self.pos, self.outputs, self.state = graph, ids, pos, outputs, state


class _State:
    """A model's static cache and graphs for one role name and slot count."""

    def __init__(self, slots: int) -> None:
        self.cache = SlotCache(slots, DEFAULT_USABLE, DEFAULT_SCRATCH)
        self.graphs: dict[tuple, _Captured] = {}
        self.widths: set[int] = {1, 2}           # widths that run as graphs (`prepare` adds; others run eager)

    def ensure(self, usable: int, scratch: int = 0, grow: bool = False) -> None:
        """Room for `usable` committed positions and graph widths up to `scratch`. A change
        reallocates the buffers at the next forward and drops every graph (they read the old
        ones); `grow` (a forward that ran out of room) at least doubles, a reservation is exact."""
        cache = self.cache
        changed = False
        if usable > cache.usable:
            cache.usable = _round_up(max(usable, 2 * cache.usable) if grow else usable)
            changed = True
        if scratch > cache.scratch:
            cache.scratch = _round_up(scratch, 16)
            changed = True
        if changed:
            self.graphs.clear()


_STATES: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[str, int], _State]]" = weakref.WeakKeyDictionary()


def _state(model: torch.nn.Module, name: str, slots: int) -> _State:
    per_model = _STATES.setdefault(model, {})
    state = per_model.get((name, slots))
    if state is None:
        state = per_model[(name, slots)] = _State(slots)
    return state


class StaticLM(CausalLM):
    """A `CausalLM` over a `SlotCache`: the same interface (batch 1: `forward`/`crop`/`cache_len`;
    rows: `forward_rows`/`crop_rows`/`row_len`), the same outputs; with `graphs`, forwards of
    width <= the cache's scratch replay a captured graph. `rows` is None at one slot, as for
    `CausalLM`, so the loop takes the same batch-1 path."""

    def __init__(self, model: torch.nn.Module, name: str = "model", graphs: bool = False) -> None:
        self.lengths = [0]
        super().__init__(model, name)
        self.graphs = graphs
        self.slots = 1
        self.state: _State | None = None
        self.graph_replays = 0                   # forwards served by a graph (a count, for tests and the profile)
        # a head over a vocabulary subset that is not compact re-gathers its rows when the weights
        # change (OSD): it runs after the graph, where that host check still happens
        self._head_in_graph = self.head.ids is None or self.head.compact

    # -- CausalLM's cache interface --------------------------------------------------------------

    @property
    def cache_len(self) -> int:
        return self.lengths[0]

    @cache_len.setter
    def cache_len(self, value: int) -> None:
        self.lengths[0] = value

    @property
    def usable(self) -> int:
        return self.state.cache.usable if self.state is not None else DEFAULT_USABLE

    def reset(self) -> None:
        self.reset_rows(1)

    def reset_rows(self, slots: int, row_cache: bool = False) -> None:
        if row_cache:            # a tree's mask and gather live in the eager engine's RowCache
            from drift_cli.errors import BadInput

            raise BadInput(f"--tree-nodes runs on the eager engine; set {ENGINE_ENV}=eager (the CUDA graphs score chains only)")
        self.slots = max(1, slots)
        self.state = _state(self.model, self.name, self.slots)
        self.lengths = [0] * self.slots
        self.state.cache.lengths = self.lengths
        self.cache = self.state.cache
        self.rows = None if self.slots == 1 else self.state.cache

    def reset_row(self, slot: int) -> None:
        if self.state is None:
            self.reset()
        self.lengths[slot] = 0

    def row_len(self, slot: int) -> int:
        return self.lengths[slot]

    def crop(self, length: int) -> None:
        self.lengths[0] = min(self.lengths[0], length)

    def crop_rows(self, slots: list[int], lengths: list[int]) -> None:
        for s, n in zip(slots, lengths, strict=True):
            self.lengths[s] = min(self.lengths[s], n)

    def reserve(self, usable: int, width: int = 0) -> None:
        """Room for `usable` committed positions per row, and graphs up to `width` tokens."""
        if self.state is None:
            self.reset()
        self.state.ensure(usable, width)

    # -- forwards --------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1, S] after the cached prefix (batch 1) -> (hidden [1, S, d], logits [1, S, V] fp32)."""
        if self.state is None:
            self.reset()
        if ids.shape[0] != 1 or self.slots != 1:
            raise ValueError(f"StaticLM.forward is the batch-1 path ({self.slots} slots, ids {tuple(ids.shape)})")
        return self.forward_rows([0], ids)

    @torch.inference_mode()
    def forward_rows(self, slots: list[int], feeds: list[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As `CausalLM.forward_rows`: feeds[i] after row slots[i]'s prefix, padding rolled back.
        A graph width runs every slot (the others at scratch positions); any other width runs the
        rows of the call only, without a graph."""
        if self.state is None:
            self.reset()
        ids, sizes = pad_feeds(feeds)
        s = ids.shape[1]
        state = self.state
        state.ensure(max(self.lengths[slot] for slot in slots) + s, grow=True)
        cache = state.cache
        graph = self.graphs and s in state.widths and s <= cache.scratch
        everyone = len(slots) == self.slots and list(slots) == list(range(self.slots))
        sel = None
        if graph or everyone:
            start = [cache.capacity - s] * self.slots                # rows not in the call: scratch positions
            for slot in slots:
                start[slot] = self.lengths[slot]
            if not everyone:
                full = ids.new_zeros(self.slots, s)
                full[torch.tensor(slots, device=ids.device)] = ids
                ids = full
        else:
            start = [self.lengths[slot] for slot in slots]
            sel = torch.tensor(slots, device=self.device)
        pos = torch.tensor([[p + i for i in range(s)] for p in start], device=self.device)   # [rows, S]
        ids = ids.to(self.device)
        with self.clock.span(f"forward_{self.name}"):
            if graph:
                hidden, logits, features = self._replay(ids, pos)
            else:
                hidden, logits, features = self._body(ids, pos, sel)
            if logits is None:
                logits = self.head(hidden)
            if graph and not everyone:
                at = torch.tensor(slots, device=hidden.device)
                hidden, logits = hidden[at], logits[at]
                features = None if features is None else features[at]
            self.features = features
        for slot, n in zip(slots, sizes, strict=True):
            self.lengths[slot] += n
        self.forward_calls += 1
        self.forward_tokens += len(slots) * s
        return hidden, logits

    def _body(self, ids: torch.Tensor, pos: torch.Tensor, sel: torch.Tensor | None = None, state: _State | None = None):
        """The forward every path runs (and a graph captures): ids, pos [rows, S] (rows: every
        slot, or `sel`'s) -> (hidden [rows, S, d], logits [rows, S, V] or None when the head runs
        outside, the captured features or None). state: the cache's owner (default: this LM's)."""
        cache = (state or self.state).cache
        cache.pos, cache.sel = pos, sel
        visible = torch.arange(cache.capacity, device=pos.device) <= pos[..., None]     # [rows, S, capacity]
        dtype = self.head.linear.weight.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=pos.device).masked_fill_(~visible, torch.finfo(dtype).min)
        out = self.decoder(input_ids=ids, position_ids=pos, attention_mask=mask[:, None], use_cache=True,
                           **{self._kw: cache})
        hidden = out.last_hidden_state
        logits = self.head(hidden) if self._head_in_graph else None
        self._collect(hidden)
        features = self.features if self.capture_layers else None
        return hidden, logits, features

    def _replay(self, ids: torch.Tensor, pos: torch.Tensor):
        key = (ids.shape[1], self.capture_layers)
        graph = self.state.graphs.get(key)
        if graph is None:
            graph = self._capture(ids.shape[1])
        graph.ids.copy_(ids)
        graph.pos.copy_(pos)
        if isinstance(graph.graph, _Emulated):     # the CPU stand-in re-runs this LM's forward over the graph's buffers
            graph.graph.fn = lambda: self._body(graph.ids, graph.pos, None, graph.state)
        graph.graph.replay()
        self.graph_replays += 1
        return tuple(None if t is None else t.clone() for t in graph.outputs)

    @torch.inference_mode()
    def _capture(self, s: int) -> _Captured:
        """Capture the width-s forward over static inputs at scratch positions (nothing committed
        is touched): a few eager runs on a side stream first (the allocator, cuBLAS, lazy
        buffers), then the capture, as torch.cuda.graphs documents."""
        state, device = self.state, self.device
        cache = state.cache
        ids = torch.zeros(self.slots, s, dtype=torch.long, device=device)
        row = torch.arange(cache.capacity - s, cache.capacity, device=device)
        pos = row.expand(self.slots, s).contiguous()
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._body(ids, pos, None, state)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self._body(ids, pos, None, state)
            captured = _Captured(graph, ids, pos, outputs, state)
        else:
            emulated = _Emulated(lambda: self._body(ids, pos, None, state))
            captured = _Captured(emulated, ids, pos, emulated.outputs, state)
        state.graphs[(s, self.capture_layers)] = captured
        return captured

    def prepare(self, widths) -> None:
        """Capture the graphs of these widths now (warm-up), at the current slot count."""
        if not self.graphs:
            return
        if self.state is None:
            self.reset()
        self.state.ensure(0, max(widths, default=0))
        self.state.widths.update(widths)
        for s in widths:
            if (s, self.capture_layers) not in self.state.graphs:
                self._capture(s)


# -- warm-up -------------------------------------------------------------------------------------

def prepare_lm(lm, slots: int, widths, usable: int = 0) -> None:
    """Reserve `usable` positions and capture `widths` at `slots` rows (no-op for an eager LM).
    Leaves the LM reset at `slots` rows."""
    if isinstance(lm, StaticLM):
        lm.reset_rows(slots)
        lm.reserve(usable, max(widths, default=0))
        lm.prepare(widths)
        lm.reset_rows(slots)


def draft_lms(policy) -> list:
    """The draft LMs a policy drives (its own, and a hybrid's model source's)."""
    out = []
    for owner in (policy, getattr(policy, "model", None)):
        lm = getattr(owner, "lm", None)
        if isinstance(lm, StaticLM) and lm not in out:
            out.append(lm)
    return out


def prepare_policy(target, policy, slots: int, gamma: int) -> float:
    """Capture the policy's draft graphs (widths 1 and 2: a step after an accepted block feeds the
    bonus token too) and the target's verification widths 1..γ+1 before the stream is timed, and
    call the policy's `warm_up()` if it has one (a method whose kernels compile on first use
    compiles them there). Returns the milliseconds spent (about 0 when nothing was left to do)."""
    t0 = time.perf_counter()
    usable = target.usable if isinstance(target, StaticLM) else DEFAULT_USABLE
    if isinstance(target, StaticLM) and target.graphs:
        target.capture(tuple(getattr(policy, "target_layers", ())))   # graphs are keyed by the recorded layers
        try:
            prepare_lm(target, slots, range(1, gamma + 2), usable)
        finally:
            target.capture(())
    for lm in draft_lms(policy):
        if lm.graphs:
            prepare_lm(lm, slots, (1, 2), usable)
    hook = getattr(policy, "warm_up", None)            # a method's own first-call costs (a kernel's JIT compile)
    if callable(hook):
        hook(slots, gamma)
    sync(getattr(target, "device", torch.device("cpu")))
    return (time.perf_counter() - t0) * 1e3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the profile's probe -------------------------------------------------------------------------

@torch.inference_mode()
def time_forward(lm, k: int, reps: int = 20, context: int = 256, warmup: int = 3) -> float:
    """Median ms of one forward of k tokens after a `context`-token cache, batch 1, on whichever
    path `lm` is (`CausalLM` eager, `StaticLM` static or graph); each rep rolls the cache back.
    A target's verification at width k is `time_forward(target, k)`, a draft step `time_forward(draft, 1)`.
    Leaves the LM reset."""
    if k < 1 or reps < 1 or context < 1:
        raise ValueError("time_forward needs k, reps and context >= 1")
    g = torch.Generator().manual_seed(0)
    vocab = lm.model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, context + k), generator=g).to(lm.device)
    lm.reset()
    if isinstance(lm, StaticLM):
        lm.reserve(context + k, k)
        lm.prepare((k,))                      # a graph at width k (no-op on the static path)
    lm.forward(ids[:, :context])
    feed = ids[:, context:]
    times = []
    for i in range(warmup + reps):
        sync(lm.device)
        t0 = time.perf_counter()
        lm.forward(feed)
        sync(lm.device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        lm.crop(context)
    lm.reset()
    times.sort()
    return times[len(times) // 2]
