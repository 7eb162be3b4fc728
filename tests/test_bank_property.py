"""Property test: random operation sequences through the Rust books and through a small
pure-Python model of the same books must agree after every step (returned slots, evictions,
errors, recency orders, valid slots, owners, tenants and stats), including across pickling.

The model is written for clarity, not speed: an OrderedDict of used slots in LRU order
(slot -> owner) and a list used as the free-slot stack.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.scale import scaled

from drift_cli import _bank

TENANT_NAMES = ["a", "b", "c", "default", ""]
NEW_TENANTS = ["d", "e", "f", "g"]


class ModelError(Exception):
    """Raised by the model with the name of the Rust error class it expects."""


def fail(kind: str):
    raise ModelError(kind)


class ModelBooks:
    def __init__(self, capacity: int, quotas: dict[str, int | None] | None = None) -> None:
        if capacity < 1:
            fail("QuotaError")
        self.capacity = capacity
        self.auto_create = quotas is None
        self.quotas: dict[str, int | None] = {}
        self.counters: dict[str, dict[str, int]] = {}
        self.order: OrderedDict[int, str] = OrderedDict()  # used slots, LRU first -> owner
        self.free = list(range(capacity))[::-1]  # stack: pop() gives the next free slot
        for name, quota in (quotas or {}).items():
            self.add_tenant(name, quota)

    # -- derived quantities
    def reserved(self) -> int:
        return sum(q for q in self.quotas.values() if q is not None)

    def pool_slots(self) -> list[int]:
        return [s for s, o in self.order.items() if self.quotas[o] is None]

    # -- operations
    def add_tenant(self, name: str, quota: int | None = None) -> None:
        if name == "" or name in self.quotas:
            fail("TenantError")
        if quota is not None and quota > self.capacity - self.reserved() - len(self.pool_slots()):
            fail("QuotaError")
        self.quotas[name] = quota
        self.counters[name] = {"hits": 0, "allocations": 0, "evictions": 0}

    def allocate(self, tenant: str = "default") -> tuple[int, bool]:
        if tenant not in self.quotas:
            if not self.auto_create:
                fail("UnknownTenant")
            if self.capacity - self.reserved() == 0:
                fail("QuotaError")
            self.add_tenant(tenant)
        quota = self.quotas[tenant]
        if quota is not None:
            candidates, limit = [s for s, o in self.order.items() if o == tenant], quota
        else:
            candidates, limit = self.pool_slots(), self.capacity - self.reserved()
        if len(candidates) < limit:
            slot, evicted = self.free.pop(), False
        elif limit == 0:
            fail("QuotaError")
        else:
            slot, evicted = candidates[0], True
            loser = self.order.pop(slot)
            self.counters[loser]["evictions"] += 1
        self.order[slot] = tenant
        self.counters[tenant]["allocations"] += 1
        return slot, evicted

    def allocate_many(self, count: int, tenant: str = "default") -> list[tuple[int, bool]]:
        return [self.allocate(tenant) for _ in range(count)]

    def check_used(self, slot: int) -> None:
        if not 0 <= slot < self.capacity or slot not in self.order:
            fail("SlotError")

    def touch(self, slots: list[int]) -> None:
        for s in slots:
            self.check_used(s)
        for s in slots:
            self.order.move_to_end(s)
            self.counters[self.order[s]]["hits"] += 1

    def release(self, slot: int) -> None:
        self.check_used(slot)
        del self.order[slot]
        self.free.append(slot)

    # -- queries
    def known(self, tenant: str) -> None:
        if tenant not in self.quotas:
            fail("UnknownTenant")

    def recency(self, tenant: str | None = None) -> list[int]:
        if tenant is not None:
            self.known(tenant)
        return [s for s, o in self.order.items() if tenant is None or o == tenant]

    def valid_slots(self, tenant: str | None = None) -> list[int]:
        return sorted(self.recency(tenant))

    def owner(self, slot: int) -> str | None:
        return self.order.get(slot)

    def tenants(self) -> dict[str, int | None]:
        return dict(self.quotas)

    def stats(self, tenant: str | None = None) -> dict[str, int]:
        if tenant is None:
            total = {k: sum(c[k] for c in self.counters.values()) for k in ("hits", "allocations", "evictions")}
            return {**total, "used": len(self.order), "capacity": self.capacity}
        self.known(tenant)
        quota = self.quotas[tenant]
        return {**self.counters[tenant], "used": len(self.recency(tenant)),
                "capacity": self.capacity - self.reserved() if quota is None else quota}


def outcome(fn, *args):
    """("ok", value) or ("error", class name): the same shape for the model and the Rust books."""
    try:
        return ("ok", fn(*args))
    except ModelError as e:
        return ("error", str(e))
    except _bank.BankError as e:
        return ("error", type(e).__name__)


def assert_same_state(real: _bank.Books, model: ModelBooks) -> None:
    assert real.recency() == model.recency()
    assert real.valid_slots() == model.valid_slots()
    assert real.tenants() == model.tenants()
    assert real.stats() == model.stats()
    assert len(real) == len(model.order)
    for t in model.tenants():
        assert real.recency(t) == model.recency(t), t
        assert real.valid_slots(t) == model.valid_slots(t), t
        assert real.stats(t) == model.stats(t), t
    assert [real.owner(s) for s in range(real.capacity)] == [model.owner(s) for s in range(model.capacity)]


tenant = st.sampled_from(TENANT_NAMES)
quota = st.none() | st.integers(0, 4)
# Slots are drawn as picks among the currently used slots (so that most batches are valid),
# with an optional bad entry (-1, out of range, or maybe free) inserted at some position.
bad_slot = st.none() | st.integers(-1, 9)
allocate = st.tuples(st.just("allocate"), tenant)
operation = st.one_of(
    allocate, allocate, allocate,  # weighted: evictions need more allocations than slots
    st.tuples(st.just("allocate_many"), st.integers(0, 4), tenant),
    st.tuples(st.just("touch"), st.lists(st.integers(0, 63), max_size=6), bad_slot, st.integers(0, 6)),
    st.tuples(st.just("release"), st.integers(0, 63), bad_slot),
    st.tuples(st.just("add_tenant"), st.sampled_from(TENANT_NAMES + NEW_TENANTS), quota),
    st.tuples(st.just("pickle")),
)


def concrete_args(op: str, args: list, used: list[int]) -> list:
    """Turns picks into slot ids, given the slots the model currently holds."""
    if op == "touch":
        picks, bad, at = args
        slots = [used[p % len(used)] for p in picks] if used else []
        if bad is not None:
            slots.insert(min(at, len(slots)), bad)
        return [slots]
    if op == "release":
        pick, bad = args
        if bad is not None:
            return [bad]
        return [used[pick % len(used)] if used else pick % 10]
    return args


books_config = st.tuples(
    st.integers(1, 6),
    st.none() | st.dictionaries(st.sampled_from(TENANT_NAMES[:4]), quota, max_size=3),
)


@settings(max_examples=scaled(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=books_config, ops=st.lists(operation, min_size=20, max_size=80))
def test_rust_books_match_the_python_model(config, ops):
    capacity, quotas = config
    made_model = outcome(ModelBooks, capacity, quotas)
    made_real = outcome(_bank.Books, capacity, quotas)
    assert made_model[0] == made_real[0]
    if made_model[0] == "error":
        assert made_model == made_real
        return
    model, real = made_model[1], made_real[1]
    for op, *args in ops:
        if op == "pickle":
            real = pickle.loads(pickle.dumps(real))
            continue
        args = concrete_args(op, args, model.recency())
        got, want = outcome(getattr(real, op), *args), outcome(getattr(model, op), *args)
        assert got == want, (op, args)
        assert_same_state(real, model)
