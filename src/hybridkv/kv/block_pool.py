"""Ref-counted pools of pages (attention blocks) or state slots, with a prefix map.

One class serves both: attention blocks (one pool shared by every attention group, block 0 is
the null block) and the state slots of one state group (no null slot). Order rules, as vLLM's:

- allocation pops from the front of the free queue;
- an id whose ref count drops to 0 goes to the front if it carries no key (reused first), to
  the back if it is cached (evicted last: the queue is LRU for cached content);
- callers free a request's table tail first, so a prefix's tail is evicted before its head.

A cached id stays in the free queue while unreferenced; allocating it evicts its key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from hybridkv.kv.free_queue import FreeQueue
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.prefix_map import CacheKey as CacheKey
from hybridkv.kv.prefix_map import PrefixMap

NULL_BLOCK = 0


class EventKind(str, Enum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class PoolEvent:
    """A change to the prefix map, for metrics and KV events."""

    kind: EventKind
    item_id: int
    key: CacheKey | None


class BlockPool:
    """Ids ``0..num_items-1``. With ``with_null`` id 0 is the null id, never allocated."""

    def __init__(self, num_items: int, *, with_null: bool, name: str = "blocks") -> None:
        first = 1 if with_null else 0
        if num_items <= first:
            raise ValueError(f"{name}: a pool needs more than {first} items, got {num_items}")
        self.name = name
        self.num_items = num_items
        self.with_null = with_null
        self.ref_cnt = [0] * num_items
        self.key: list[CacheKey | None] = [None] * num_items
        self.owner: list[int | None] = [None] * num_items  # group of the last allocation
        self.free_queue = FreeQueue(list(range(first, num_items)), num_items)
        self.cached = PrefixMap()
        self.events: list[PoolEvent] = []
        # Without a consumer (take_events) the list would grow without bound: turn it off.
        self.record_events = True

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    @property
    def capacity(self) -> int:
        return self.num_items - (1 if self.with_null else 0)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.capacity

    def get_cached(self, key: CacheKey) -> int | None:
        """Any one id cached under ``key``, or None."""
        ids = self.cached.get(key)
        return next(iter(ids)) if ids else None

    def is_free_cached(self, item_id: int) -> bool:
        """True for a cached id that nobody references (touching it consumes a free id):
        by the pool's invariant an unreferenced id is in the free queue."""
        return self.ref_cnt[item_id] == 0

    # -- mutations -----------------------------------------------------------------------

    def allocate(self, n: int, group_id: int) -> list[int]:
        """Pop ``n`` ids from the front (evicting their keys), each with ref count 1; returned
        in ascending order. Which ids are popped is the queue's business (eviction order);
        handing them out ascending makes a request's table runs of consecutive pages where the
        ids allow it: a request's blocks are freed tails first, so they come back descending,
        and ascending runs are what a transfer merges into one descriptor per layer (NIXL
        reads, offloads) and what attention streams through in page order."""
        if n > self.num_free:
            raise RuntimeError(f"{self.name}: asked for {n} ids, {self.num_free} free")
        out = self.free_queue.head(n)
        queue, key, ref_cnt, owner = self.free_queue.order, self.key, self.ref_cnt, self.owner
        keyed = []
        for i in out:
            del queue[i]
            if key[i] is not None:
                keyed.append(i)
            ref_cnt[i] = 1
            owner[i] = group_id
        if keyed:
            self._drop_keys(keyed)
        out.sort()
        return out

    def touch(self, ids: Iterable[int]) -> None:
        """Take a reference on cached ids (a hit); unreferenced ones leave the free queue."""
        null = NULL_BLOCK if self.with_null else -1
        ref_cnt, queue = self.ref_cnt, self.free_queue.order
        for i in ids:
            if i == null:
                continue
            count = ref_cnt[i]
            if count == 0:
                del queue[i]
            ref_cnt[i] = count + 1

    def free(self, ids: Iterable[int]) -> None:
        """Drop one reference on each id, in the order given (callers pass tails first)."""
        null = NULL_BLOCK if self.with_null else -1
        ref_cnt, key, queue = self.ref_cnt, self.key, self.free_queue.order
        to_front = queue.move_to_end
        for i in ids:
            if i == null:
                continue
            count = ref_cnt[i]
            if count == 1:
                ref_cnt[i] = 0
                queue[i] = None  # cached: the back (evicted last)
                if key[i] is None:
                    to_front(i, False)  # unkeyed: the front (reused first)
            elif count > 1:
                ref_cnt[i] = count - 1
            else:
                raise RuntimeError(f"{self.name}: double free of id {i}")

    def cache(self, item_id: int, key: CacheKey) -> None:
        """Register a referenced id whose bytes are final under ``key``."""
        if self.key[item_id] is not None:
            return
        if self.ref_cnt[item_id] <= 0:
            raise RuntimeError(f"{self.name}: caching unreferenced id {item_id}")
        self.key[item_id] = key
        self.cached.add(key, item_id)
        if self.record_events:
            self.events.append(PoolEvent(EventKind.STORED, item_id, key))

    def cache_all(self, item_ids: list[int], hashes: list[BlockHash], group_id: int) -> None:
        """``cache(item_ids[k], (hashes[k], group_id))`` for each k; the null id is skipped."""
        key, ref_cnt, cached = self.key, self.ref_cnt, self.cached.group(group_id)
        null = NULL_BLOCK if self.with_null else -1
        events = self.events if self.record_events else None
        for i, h in zip(item_ids, hashes, strict=True):
            if i == null or key[i] is not None:
                continue
            if ref_cnt[i] <= 0:
                raise RuntimeError(f"{self.name}: caching unreferenced id {i}")
            k = (h, group_id)
            key[i] = k
            ids = cached.get(h)
            if ids is None:
                cached[h] = {i: None}
            else:
                ids[i] = None
            if events is not None:
                events.append(PoolEvent(EventKind.STORED, i, k))

    def evict(self, item_id: int) -> None:
        """Drop an id's key (its bytes are no longer trusted); ref counts are untouched."""
        if self.key[item_id] is not None and self.ref_cnt[item_id] == 0:
            # A free unkeyed id belongs at the front: move it there.
            self.free_queue.remove(item_id)
            self._drop_key(item_id)
            self.free_queue.prepend(item_id)
        else:
            self._drop_key(item_id)

    def reset(self) -> bool:
        """Clear the prefix map; only when nothing is referenced. Returns success."""
        if self.num_free != self.capacity:
            return False
        for i in range(self.num_items):
            self.key[i] = None
        self.cached.clear()
        if self.record_events:
            self.events.append(PoolEvent(EventKind.CLEARED, -1, None))
        return True

    def take_events(self) -> list[PoolEvent]:
        events, self.events = self.events, []
        return events

    def _drop_key(self, i: int) -> None:
        key = self.key[i]
        if key is None:
            return
        self.key[i] = None
        self.cached.discard(key, i)
        if self.record_events:
            self.events.append(PoolEvent(EventKind.REMOVED, i, key))

    def _drop_keys(self, item_ids: list[int]) -> None:
        """``_drop_key`` of each id (every one carries a key)."""
        key, by_group = self.key, self.cached.by_group
        events = self.events if self.record_events else None
        for i in item_ids:
            k: CacheKey = key[i]  # type: ignore[assignment]  # keyed, by the caller
            key[i] = None
            h, g = k
            found = by_group[g]
            ids = found[h]
            if len(ids) == 1:  # the usual case: the key goes with its only id
                del found[h]
            else:
                del ids[i]
            if events is not None:
                events.append(PoolEvent(EventKind.REMOVED, i, k))

    # -- integrity -----------------------------------------------------------------------

    def check_integrity(self) -> None:
        """ref 0 <=> in the free queue; the map and the per-id keys agree; owners match."""
        first = 1 if self.with_null else 0
        in_queue = list(self.free_queue)
        assert len(in_queue) == len(set(in_queue)) == self.num_free, f"{self.name}: queue corrupt"
        for i in range(first, self.num_items):
            assert self.ref_cnt[i] >= 0, f"{self.name}: negative ref count on {i}"
            assert (self.ref_cnt[i] == 0) == (i in self.free_queue), (
                f"{self.name}: id {i} ref/queue mismatch"
            )
            key = self.key[i]
            if key is not None:
                assert i in self.cached.get(key, {}), f"{self.name}: id {i} keyed but not mapped"
                assert self.owner[i] == key[1], (
                    f"{self.name}: id {i} owned by {self.owner[i]}, key of group {key[1]}"
                )
        for key, ids in self.cached.items():
            for i in ids:
                assert self.key[i] == key, f"{self.name}: map entry {key!r} -> {i} is stale"
        if self.with_null:
            assert NULL_BLOCK not in self.free_queue and self.key[NULL_BLOCK] is None
