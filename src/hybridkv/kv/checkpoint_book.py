"""The checkpoints of one state group: what each one is worth, a budget, eviction by value.

A checkpoint is a keyed state slot (the state exactly at a block boundary). The group may
hold at most ``capacity`` of them (pending saves included): ``state_checkpoint_budget`` of the
KV memory, converted to slots by the engine. When a new checkpoint would exceed it, or a slot
is needed and only checkpoints are free, the least valuable unreferenced checkpoint goes
first. A checkpoint is worth the hits it can still serve, and the book reads that from the
shape of what is cached:

- *shared*: it served hits to two or more requests (a system prompt, a few-shot block, a
  prompt resent): more sharers are likely, keep it longest;
- *frontier*: no other cached checkpoint continues its prefix (a conversation's latest turn
  end, where its next turn resumes);
- *link*: another cached checkpoint continues its prefix, so a request that shares all of it
  resumes further on; it only serves a request that leaves the prefix between the two (a
  branch). Of two links, the one more checkpoints continue is nearer the head of a prefix
  (fewer tokens into it) and more likely a branch point; the one fewer do goes first.

Eviction order, smallest first (``eviction_rank``):

1. not shared before shared;
2. periodic boundaries before prompt ends and junctions, and those before the boundaries a
   caller named (``cache_boundaries``, chat message ends, a finished request's last state);
3. links before frontiers; among links, fewer continuing checkpoints first (a prefix's tail
   before its head);
4. least recently used (registered or hit) first.

This reads the issue's "a prefix's tail before its head; a checkpoint that has served hits
before one that never has; message boundaries before periodic ones" as a ranking of what to
keep. A checkpoint that served one hit is not shared: on a multi-turn chat every turn end
serves exactly one (the next turn) and is then continued by a newer one; protecting such
checkpoints filled the pool with stale turn ends and, under budget pressure, made message
boundaries cost prompt tokens (``benchmarks/prefix_trace.py``, docs/benchmarks.md B3).

Admission uses the same order without recency: a new checkpoint (a frontier that never served
a hit, of its kind) only replaces a victim that ranks strictly below it (a link, or a lower
kind); otherwise it is not saved, so equals do not churn the pool. Slots needed for live and
trailing states evict in rank order with recency (``free_unkeyed``).

The book never touches tensors nor ref counts; it mirrors the pool's keys and drops an entry
whose slot lost its key by other means (reset, the pool's own eviction, a failed load).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kv.block_pool import BlockPool, CacheKey
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

SHARED_HITS = 2  # hits that make a checkpoint shared (one hit: a turn end resumed once)


def _edges(prefix: tuple[BlockHash, ...], last: BlockHash) -> zip[tuple[BlockHash, BlockHash]]:
    """(each block hash of ``prefix``, the block hash after it); ``last`` ends the chain."""
    return zip(prefix, (*prefix[1:], last))  # noqa: B905 - one shorter when prefix is empty


@dataclass(slots=True)
class CheckpointEntry:
    key: CacheKey
    boundary: int
    kind: CheckpointKind
    prefix: tuple[BlockHash, ...]  # the block hashes before the boundary's own
    hits: int = 0
    stamp: int = 0  # last registration or hit (a clock, not time)


class CheckpointBook:
    def __init__(self, pool: BlockPool, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"checkpoint capacity must be >= 0, got {capacity}")
        self.pool = pool
        self.capacity = capacity  # None: bounded by the slots only
        self.entries: dict[int, CheckpointEntry] = {}
        # block hash -> {the block hash after it: cached entries whose prefix goes that way}
        self.children: dict[BlockHash, dict[BlockHash, int]] = {}
        self.evictions: list[CheckpointEntry] = []  # tests read the order; cleared by them
        self.record_evictions = False
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def add(
        self,
        slot: int,
        key: CacheKey,
        boundary: int,
        kind: CheckpointKind,
        prefix: tuple[BlockHash, ...],
    ) -> None:
        """Record a slot the pool just keyed (``prefix``: the hashes of the blocks before)."""
        self.entries[slot] = CheckpointEntry(key, boundary, kind, prefix, stamp=self._tick())
        children = self.children
        for h, after in _edges(prefix, key[0]):
            ways = children.setdefault(h, {})
            ways[after] = ways.get(after, 0) + 1

    def num_continuing(self, entry: CheckpointEntry) -> int:
        """How many other cached checkpoints continue this one's prefix (0: a frontier)."""
        return sum(self.children.get(entry.key[0], {}).values())

    def is_shared(self, entry: CheckpointEntry) -> bool:
        """Two or more requests used it: it served two hits, or cached checkpoints continue
        its prefix in two or more ways (a branch point: a system prompt's end, a junction)."""
        return entry.hits >= SHARED_HITS or len(self.children.get(entry.key[0], ())) >= 2

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
        children = self.children
        for h, after in _edges(entry.prefix, entry.key[0]):
            ways = children[h]
            left = ways[after] - 1
            if left:
                ways[after] = left
            elif len(ways) > 1:
                del ways[after]
            else:
                del children[h]

    def count(self) -> int:
        self.prune()
        return len(self.entries)

    def num_free_keyed(self) -> int:
        return sum(1 for s in self.entries if self.pool.ref_cnt[s] == 0)

    def victim(self, newcomer: frozenset[BlockHash] = frozenset()) -> int | None:
        """The least valuable unreferenced checkpoint, or None. ``newcomer``: the prefix of
        a checkpoint about to be added, which makes the ones it continues links."""
        self.prune()
        free = [(s, e) for s, e in self.entries.items() if self.pool.ref_cnt[s] == 0]
        if not free:
            return None
        slot, _ = min(free, key=lambda se: self.eviction_rank(se[1], newcomer))
        return slot

    def eviction_rank(
        self, entry: CheckpointEntry, newcomer: frozenset[BlockHash] = frozenset()
    ) -> tuple[bool, int, bool, int, int]:
        """Smallest goes first: not shared, periodic, links (tails of a prefix first), least
        recently used."""
        continuing = self.num_continuing(entry) + (entry.key[0] in newcomer)
        return (
            self.is_shared(entry),
            int(entry.kind),
            continuing == 0,
            -continuing,
            entry.stamp,
        )

    def evict_one(self, newcomer: frozenset[BlockHash] = frozenset()) -> bool:
        """Evict the least valuable unreferenced checkpoint; False if none is free."""
        slot = self.victim(newcomer)
        if slot is None:
            return False
        if self.record_evictions:
            self.evictions.append(self.entries[slot])
        self._forget(slot)
        self.pool.evict(slot)
        return True

    def make_room(
        self, num_pending: int, kind: CheckpointKind, prefix: tuple[BlockHash, ...] = ()
    ) -> bool:
        """Evict until one more checkpoint of ``kind`` after ``prefix`` (the hashes of the
        blocks before its boundary) fits the capacity, never a checkpoint worth more than the
        new one; False if it cannot. The checkpoints the new one continues count as links:
        a conversation's new turn end displaces its previous one."""
        if self.capacity is None or self.count() + num_pending < self.capacity:
            return True
        rank = (False, int(kind), True, 0)
        newcomer = frozenset(prefix)
        while self.count() + num_pending >= self.capacity:
            slot = self.victim(newcomer)
            if slot is None or self.eviction_rank(self.entries[slot], newcomer)[:4] >= rank:
                return False
            self.evict_one(newcomer)
        return True

    def free_unkeyed(self, n: int) -> None:
        """Make ``n`` free slots carry no key, evicting by value (not the pool's LRU)."""
        self.prune()
        while self.pool.num_free - self.num_free_keyed() < n and self.evict_one():
            pass
