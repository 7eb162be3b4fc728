"""Books for DRIFT tests: the real Rust `drift_cli._bank.Books` when it is built, else a small
pure-Python stand-in with the same semantics (capacity, free slots first in ascending order,
then the least recently used slot; `touch` marks slots used in order). The stand-in lets the
bank math be tested before the extension lands; it is not shipped."""

from __future__ import annotations

from collections import OrderedDict

try:
    from drift_cli._bank import Books as RustBooks
except ImportError:  # the extension is not built yet
    RustBooks = None


class ListBooks:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, str] = OrderedDict()   # slot -> tenant, least recent first
        self._stats = {"hits": 0, "allocations": 0, "evictions": 0}

    def allocate(self, tenant: str = "default") -> tuple[int, bool]:
        free = [s for s in range(self.capacity) if s not in self._lru]
        evicted = not free
        slot = free[0] if free else next(iter(self._lru))
        self._lru.pop(slot, None)
        self._lru[slot] = tenant
        self._stats["allocations"] += 1
        self._stats["evictions"] += int(evicted)
        return slot, evicted

    def touch(self, slots) -> None:
        for s in slots:
            self._lru.move_to_end(s)
            self._stats["hits"] += 1

    def recency(self, tenant=None) -> list[int]:
        return list(self._lru)

    def valid_slots(self, tenant=None) -> list[int]:
        return sorted(self._lru)

    def extent(self) -> tuple[int, int]:
        """(hi, n_valid); no slot is ever released here, so hi is 1 + the highest valid slot."""
        return (max(self._lru) + 1 if self._lru else 0, len(self._lru))

    def tenants(self) -> dict:
        return {t: None for t in dict.fromkeys(self._lru.values())}

    def stats(self, tenant=None) -> dict:
        return dict(self._stats, used=len(self._lru), capacity=self.capacity)


def make_books(capacity: int):
    return RustBooks(capacity) if RustBooks is not None else ListBooks(capacity)
