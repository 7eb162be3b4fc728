"""The Books binding (drift_cli._bank): argument conversion, typed errors, pickling.

The bookkeeping logic itself is tested in Rust (`cargo test`) and against a Python model in
test_bank_property.py; this file pins down what Python callers see.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from drift_cli import _bank
from drift_cli._bank import (BankError, Books, QuotaError, SlotError, SnapshotCorrupt, SnapshotError,
                             SnapshotVersionError, TenantError, UnknownTenant)


def filled(capacity: int = 4, n: int = 4) -> Books:
    b = Books(capacity)
    for _ in range(n):
        b.allocate()
    return b


def test_error_hierarchy_is_typed():
    assert issubclass(UnknownTenant, TenantError) and issubclass(TenantError, BankError)
    for cls in (SlotError, QuotaError, SnapshotError):
        assert issubclass(cls, BankError)
    for cls in (SnapshotCorrupt, SnapshotVersionError, _bank.SnapshotDraftMismatch):
        assert issubclass(cls, SnapshotError)
    assert BankError.__module__ == "drift_cli._bank"
    assert _bank.SNAPSHOT_FORMAT_VERSION == 1


def test_allocate_evicts_lru_and_reports_it():
    b = filled(3, 3)
    b.touch([0])
    assert b.allocate() == (1, True)
    assert b.recency() == [2, 0, 1]
    assert len(b) == 3
    assert b.stats() == {"hits": 1, "allocations": 4, "evictions": 1, "used": 3, "capacity": 3}


def test_touch_accepts_lists_tuples_and_integer_arrays():
    b = filled(5, 5)
    b.touch((4, 3))
    b.touch(np.array([1, 0], dtype=np.int64))
    b.touch(np.array([2], dtype=np.int32))
    b.touch(np.array([], dtype=np.int64))
    assert b.recency() == [4, 3, 1, 0, 2]
    assert b.stats()["hits"] == 5


@pytest.mark.parametrize("bad", [[-1], [5], [2**40], np.array([0, -3], dtype=np.int64)])
def test_out_of_range_slots_raise_slot_error_and_change_nothing(bad):
    b = filled(5, 5)
    before = b.recency()
    with pytest.raises(SlotError, match="out of range"):
        b.touch(bad)
    assert b.recency() == before and b.stats()["hits"] == 0


def test_free_slots_raise_slot_error():
    b = filled(4, 2)
    with pytest.raises(SlotError, match="slot 3 is free"):
        b.touch([0, 3])
    with pytest.raises(SlotError, match="slot 2 is free"):
        b.release(2)
    with pytest.raises(SlotError, match="out of range"):
        b.release(-1)
    with pytest.raises(SlotError, match="out of range"):
        b.is_valid(4)
    with pytest.raises(SlotError, match="out of range"):
        b.owner(99)
    assert b.is_valid(1) and not b.is_valid(3)
    assert b.owner(0) == "default" and b.owner(3) is None


def test_release_frees_and_the_slot_is_reused_first():
    b = filled(4, 4)
    b.release(2)
    assert b.valid_slots() == [0, 1, 3] and len(b) == 3
    assert b.allocate() == (2, False)


def test_quotas_keep_eviction_inside_the_tenant():
    b = Books(4, {"x": 1, "y": 3})
    assert b.tenants() == {"x": 1, "y": 3}
    assert b.allocate("x") == (0, False)
    assert b.allocate("y") == (1, False)
    assert b.allocate("x") == (0, True)
    assert b.recency("y") == [1] and b.valid_slots("x") == [0]
    assert b.stats("x") == {"hits": 0, "allocations": 2, "evictions": 1, "used": 1, "capacity": 1}
    with pytest.raises(UnknownTenant, match='unknown tenant "z"'):
        b.allocate("z")
    with pytest.raises(UnknownTenant):
        b.recency("z")
    with pytest.raises(UnknownTenant):
        b.allocate()  # no "default" tenant was declared


def test_quota_errors():
    with pytest.raises(QuotaError):
        Books(4, {"x": 3, "y": 2})
    with pytest.raises(QuotaError, match=">= 0"):
        Books(4, {"x": -1})
    with pytest.raises(QuotaError, match="capacity"):
        Books(0)
    with pytest.raises(QuotaError, match="between 1 and 67108864"):
        Books(2**26 + 1)
    b = Books(4, {"x": 0, "p": None})
    with pytest.raises(QuotaError, match="quota 0"):
        b.allocate("x")
    assert b.allocate("p") == (0, False)
    with pytest.raises(TenantError, match="already exists"):
        b.add_tenant("p")
    with pytest.raises(TenantError, match="empty"):
        b.add_tenant("")
    with pytest.raises(QuotaError):
        b.add_tenant("big", 4)  # p holds a slot of the pool
    b.add_tenant("ok", 3)
    assert b.tenants() == {"x": 0, "p": None, "ok": 3}
    assert b.stats("p")["capacity"] == 1


def test_capacity_is_read_only():
    b = Books(7)
    assert b.capacity == 7
    with pytest.raises(AttributeError):
        b.capacity = 8
    assert repr(b) == "Books(capacity=7, used=0, tenants=0)"


def busy() -> Books:
    b = Books(6, {"q": 2, "p": None})
    for t in ["q", "p", "q", "p", "q", "p", "p", "p"]:
        b.allocate(t)
    b.touch([1, 0, 1])
    b.release(3)
    b.add_tenant("late")
    return b


def same_books(a: Books, b: Books) -> bool:
    return (a.capacity == b.capacity and a.recency() == b.recency() and a.tenants() == b.tenants()
            and a.stats() == b.stats() and all(a.stats(t) == b.stats(t) for t in a.tenants())
            and a.__getstate__() == b.__getstate__())


@pytest.mark.parametrize("clone", [lambda b: pickle.loads(pickle.dumps(b)), copy.deepcopy, copy.copy])
def test_pickle_and_copy_round_trip_and_continue_identically(clone):
    a = busy()
    b = clone(a)
    assert same_books(a, b)
    for t in ["late", "p", "q", "late"]:
        assert a.allocate(t) == b.allocate(t)
    assert same_books(a, b)
    with pytest.raises(UnknownTenant):
        b.allocate("nobody")  # quota-declared books keep refusing unknown tenants


def test_pickled_state_is_checked():
    b = busy()
    version, state = b.__getstate__()
    fresh = Books(6)
    with pytest.raises(SnapshotVersionError):
        fresh.__setstate__((version + 1, state))
    with pytest.raises(SnapshotCorrupt):
        fresh.__setstate__((version, state.replace(b'"free":[', b'"free":[0,')))
    with pytest.raises(SnapshotCorrupt):
        fresh.__setstate__((version, b"\xff"))
    huge = b'{"capacity":4000000000,"auto_create":true,"tenants":[],"recency":[],"owners":[],"free":[]}'
    with pytest.raises(SnapshotCorrupt, match="cover the capacity"):
        fresh.__setstate__((version, huge))
    assert fresh.recency() == [] and len(fresh) == 0, "a refused state leaves the books untouched"


def test_allocate_many_equals_allocate_in_a_loop():
    a, b = filled(3, 2), filled(3, 2)
    assert a.allocate_many(3) == [b.allocate() for _ in range(3)] == [(2, False), (0, True), (1, True)]
    assert a.__getstate__() == b.__getstate__()
    q = Books(3, {"z": 0})
    with pytest.raises(QuotaError):
        q.allocate_many(2, "z")
    assert len(q) == 0 and q.stats("z")["allocations"] == 0
