"""The checkpoints of one state group: what each one is worth, a budget, eviction by value.

A checkpoint is a keyed state slot (the state exactly at a block boundary). The group may
hold at most ``capacity`` of them (pending saves included): ``state_checkpoint_budget`` of the
KV memory, converted to slots by the engine. When a new checkpoint would exceed it, or a slot
is needed and only checkpoints are free, the least valuable unreferenced checkpoint goes
first. The issue's wording ("a prefix's tail before its head; a checkpoint that has served
hits before one that never has; message boundaries before periodic ones") is read as a
ranking of what to *keep*, with eviction in this order:

1. a prefix's tail before its head: a checkpoint with a later checkpoint registered on its own
   prefix (a child, still cached) is evicted only when no leaf is free;
2. one that never served a hit before one that has;
3. periodic boundaries before prompt ends and junctions, and those before the boundaries a
   caller named (``cache_boundaries``, chat message ends, a finished request's last state);
4. least recently used (registered or hit) first.

The book never touches tensors nor ref counts; it mirrors the pool's keys and drops an entry
whose slot lost its key by other means (reset, the pool's own eviction, a failed load).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kv.block_pool import BlockPool, CacheKey
from hybridkv.kv.checkpoints import CheckpointKind


@dataclass(slots=True)
class CheckpointEntry:
    key: CacheKey
    boundary: int
    kind: CheckpointKind
    parent: int | None  # the nearest earlier checkpoint on the same prefix, when registered
    children: int = 0
    hits: int = 0
    stamp: int = 0  # last registration or hit (a clock, not time)


class CheckpointBook:
    def __init__(self, pool: BlockPool, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"checkpoint capacity must be >= 0, got {capacity}")
        self.pool = pool
        self.capacity = capacity  # None: bounded by the slots only
        self.entries: dict[int, CheckpointEntry] = {}
        self.evictions: list[CheckpointEntry] = []  # tests read the order; cleared by them
        self.record_evictions = False
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def add(
        self, slot: int, key: CacheKey, boundary: int, kind: CheckpointKind, parent: int | None
    ) -> None:
        """Record a slot the pool just keyed."""
        if parent is not None and parent in self.entries:
            self.entries[parent].children += 1
        else:
            parent = None
        self.entries[slot] = CheckpointEntry(key, boundary, kind, parent, stamp=self._tick())

    def hit(self, slot: int) -> None:
        entry = self.live_entry(slot)
        if entry is not None:
            entry.hits += 1
            entry.stamp = self._tick()

    def live_entry(self, slot: int) -> CheckpointEntry | None:
        entry = self.entries.get(slot)
        if entry is not None and self.pool.key[slot] != entry.key:
            self._forget(slot)
            return None
        return entry

    def prune(self) -> None:
        """Forget entries whose slot lost its key behind the book's back."""
        for slot in [s for s, e in self.entries.items() if self.pool.key[s] != e.key]:
            self._forget(slot)

    def _forget(self, slot: int) -> None:
        entry = self.entries.pop(slot)
        parent = self.entries.get(entry.parent) if entry.parent is not None else None
        if parent is not None:
            parent.children -= 1
        for other in self.entries.values():  # its children now hang off its parent
            if other.parent == slot:
                other.parent = entry.parent
                if parent is not None:
                    parent.children += 1

    def count(self) -> int:
        self.prune()
        return len(self.entries)

    def num_free_keyed(self) -> int:
        return sum(1 for s in self.entries if self.pool.ref_cnt[s] == 0)

    def victim(self) -> int | None:
        """The least valuable unreferenced checkpoint, or None."""
        self.prune()
        free = [(s, e) for s, e in self.entries.items() if self.pool.ref_cnt[s] == 0]
        if not free:
            return None
        slot, _ = min(free, key=lambda se: _eviction_rank(se[1]))
        return slot

    def evict_one(self) -> bool:
        """Evict the least valuable unreferenced checkpoint; False if none is free."""
        slot = self.victim()
        if slot is None:
            return False
        if self.record_evictions:
            self.evictions.append(self.entries[slot])
        self._forget(slot)
        self.pool.evict(slot)
        return True

    def make_room(self, num_pending: int) -> bool:
        """Evict until one more checkpoint fits the capacity; False if it cannot."""
        if self.capacity is None:
            return True
        while self.count() + num_pending >= self.capacity:
            if not self.evict_one():
                return False
        return True

    def free_unkeyed(self, n: int) -> None:
        """Make ``n`` free slots carry no key, evicting by value (not the pool's LRU)."""
        self.prune()
        while self.pool.num_free - self.num_free_keyed() < n and self.evict_one():
            pass


def _eviction_rank(entry: CheckpointEntry) -> tuple[bool, bool, int, int]:
    return (entry.children > 0, entry.hits > 0, int(entry.kind), entry.stamp)
