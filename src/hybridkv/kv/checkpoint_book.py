"""The checkpoints of one state group: a budget, and which ones to keep by expected saved work.

A checkpoint is a keyed state slot (the state exactly at a block boundary). The group may
hold at most ``capacity`` of them (pending saves included): ``state_checkpoint_budget`` of the
KV memory, converted to slots by the engine. Every checkpoint of a group holds the same bytes,
so its value per byte is its expected saved work (``checkpoint_value``)::

    value = expected reuses (its kind, the hits it served) x recompute_cost(ancestor, boundary)

where the ancestor is the deepest other cached checkpoint on its prefix (a request that would
resume here resumes there without it). The expected reuses are learned online from the
overlap depths requests actually bring (``arrive``): each request's longest prefix found in
the attention cache ends at some depth, and the deepest checkpoint within it, kept or a
*ghost* (evicted or refused, remembered by key), is where it resumes or would have. So the
book learns, from the trace itself, that a re-sent prompt resumes at its end, a conversation
at its last turn's end, a first sharer at the shared head, and that a checkpoint that served
its one hit (a turn end, a resent prompt) is rarely used again.

Eviction takes the unreferenced checkpoint of least value (oldest first among equals).
Admission compares (``checkpoint_admission``): a new checkpoint enters only if the book is
worth more with it, so a scan of one-shot prompt tails (their kind's reuse learned low) never
flushes checkpoints that get reused, and equals never churn (what keeps a budget's worth of a
re-sent batch); a turn end, caller boundary or finished state must beat its victim by
``ADMIT_MARGIN`` (Belady's rule for a cycle of conversations longer than the budget), and a
request's last state may supersede its own prompt end or the turn end it resumed from (a
conversation moves its checkpoint forward). A ghost made again comes back with the hits it
had (second-hit admission); caller boundaries and junctions (heads other requests share)
start with high priors, so a first sharer finds them. Checkpoints referenced by a running
request (the one it resumed from, held until it finishes; a restore in flight) are never
evicted; when nothing can be evicted a due save is skipped and counted
(``CheckpointCounters.refused``), the request runs on.

The book never touches tensors nor ref counts; it mirrors the pool's keys and drops an entry
whose slot lost its key by other means (reset, the pool's own eviction, a failed load).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.kv.block_pool import BlockPool, CacheKey
from hybridkv.kv.checkpoint_admission import Newcomer, admission_victim, supersedable
from hybridkv.kv.checkpoint_counters import CheckpointCounters, EvictReason
from hybridkv.kv.checkpoint_value import (
    MIN_LINK_SHARE,
    CheckpointEntry,
    Ghosts,
    ReuseRates,
    recompute_cost,
)
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

GHOSTS_PER_CHECKPOINT = 8  # ghosts remembered per checkpoint of the budget (at least 256)


class CheckpointBook:
    def __init__(self, pool: BlockPool, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"checkpoint capacity must be >= 0, got {capacity}")
        self.pool = pool
        self.capacity = capacity  # None: bounded by the slots only
        self.entries: dict[int, CheckpointEntry] = {}
        self.by_hash: dict[BlockHash, int] = {}  # the key's block hash -> slot
        self.through: dict[BlockHash, set[int]] = {}  # block hash -> slots whose prefix has it
        self.rates = ReuseRates()
        self.ghosts = Ghosts(max(256, GHOSTS_PER_CHECKPOINT * (capacity or 0)))
        self.counters = CheckpointCounters()
        self.evictions: list[CheckpointEntry] = []  # tests read the order; cleared by them
        self.record_evictions = False
        self._clock = 0

    # -- learning ------------------------------------------------------------------------

    def arrive(self, hashes: Sequence[BlockHash], overlap_blocks: int, slot: int | None) -> None:
        """A request arrives whose first ``overlap_blocks`` blocks are cached KV; it restores
        the checkpoint at ``slot`` (None: none). The deepest checkpoint within the overlap,
        kept or a ghost, is where it resumes (or would have): that one's kind learns a reuse."""
        self._clock += 1
        for k in range(min(overlap_blocks, len(hashes)), 0, -1):
            h = hashes[k - 1]
            found = self.by_hash.get(h)
            entry = self.live_entry(found) if found is not None else None
            ghost = self.ghosts.items.get(h) if entry is None else None
            if entry is not None or ghost is not None:
                seen = entry or ghost
                assert seen is not None
                self.rates.reuse(seen.kind, seen.hits)
                seen.hits += 1
                break
        restored = self.live_entry(slot) if slot is not None else None
        if restored is not None:
            self.counters.count_hit(restored.kind)
            restored.stamp = self._clock

    def value(self, entry: CheckpointEntry) -> float:
        """Expected prefill work it saves (in tokens at position 0). A *link* (cached
        checkpoints continue its prefix, one way only, and it never served a hit) serves a
        request only if it does not go on to the checkpoints below: its expected reuse is
        scaled by the chance they miss (at least ``MIN_LINK_SHARE``)."""
        gain = recompute_cost(entry.ancestor, entry.boundary)
        expected = self._expected(entry)
        if entry.hits == 0 and self.num_ways(entry) == 1:
            onward = max(self._expected(self.entries[s]) for s in self.through[entry.key[0]])
            expected *= max(1.0 - min(onward, 1.0), MIN_LINK_SHARE)
        return expected * gain

    def num_ways(self, entry: CheckpointEntry) -> int:
        """In how many ways cached checkpoints continue its prefix (0: none, a frontier;
        1: a link; 2 or more: a branch point, a head requests share)."""
        below = self.through.get(entry.key[0], ())
        depth = len(entry.prefix) + 1  # the block after this boundary, in a descendant
        return len({self.entries[s].prefix[depth : depth + 1] for s in below})

    def _expected(self, entry: CheckpointEntry) -> float:
        return self.rates.expected(entry.kind, entry.hits)

    # -- entries -------------------------------------------------------------------------

    def add(
        self,
        slot: int,
        key: CacheKey,
        boundary: int,
        kind: CheckpointKind,
        prefix: tuple[BlockHash, ...],
        hits: int = 0,
    ) -> None:
        """Record a slot the pool just keyed (``prefix``: the hashes of the blocks before)."""
        entry = CheckpointEntry(key, boundary, kind, prefix, hits, self._clock)
        entry.ancestor = self._ancestor(prefix)
        self.entries[slot] = entry
        self.by_hash[key[0]] = slot
        for s in self.through.get(key[0], ()):
            below = self.entries[s]
            below.ancestor = max(below.ancestor, boundary)
        for h in prefix:
            self.through.setdefault(h, set()).add(slot)
        self.counters.count_admitted(kind)

    def _ancestor(self, prefix: tuple[BlockHash, ...]) -> int:
        slot = self.parent(prefix)
        return 0 if slot is None else self.entries[slot].boundary

    def live_entry(self, slot: int) -> CheckpointEntry | None:
        entry = self.entries.get(slot)
        if entry is not None and self.pool.key[slot] != entry.key:
            self._forget(slot, EvictReason.LOST)
            return None
        return entry

    def prune(self) -> None:
        """Forget entries whose slot lost its key behind the book's back."""
        for slot in [s for s, e in self.entries.items() if self.pool.key[s] != e.key]:
            self._forget(slot, EvictReason.LOST)

    def _forget(self, slot: int, reason: EvictReason) -> None:
        entry = self.entries.pop(slot)
        self._unmap(entry.key[0], slot)
        for h in entry.prefix:
            slots = self.through[h]
            slots.discard(slot)
            if not slots:
                del self.through[h]
        for s in self.through.get(entry.key[0], ()):
            below = self.entries[s]
            if below.ancestor == entry.boundary:
                below.ancestor = self._ancestor(below.prefix)
        self.ghosts.remember(entry.key[0], entry.kind, entry.hits)
        self.counters.count_evicted(reason)
        if self.record_evictions:
            self.evictions.append(entry)

    def _unmap(self, h: BlockHash, slot: int) -> None:
        """Drop ``slot`` from ``by_hash``: the pool may key two slots alike (a stale entry's
        key keyed again on another slot), so the hash then maps to the other one."""
        if self.by_hash.get(h) != slot:
            return
        del self.by_hash[h]
        other = next((s for s, e in self.entries.items() if e.key[0] == h), None)
        if other is not None:
            self.by_hash[h] = other

    def count(self) -> int:
        self.prune()
        return len(self.entries)

    def num_free_keyed(self) -> int:
        return sum(1 for s in self.entries if self.pool.ref_cnt[s] == 0)

    # -- eviction and admission ----------------------------------------------------------

    def victim(self) -> int | None:
        """The least valuable unreferenced checkpoint (oldest among equals), or None."""
        self.prune()
        ref_cnt = self.pool.ref_cnt
        free = [(self.value(e), e.stamp, s) for s, e in self.entries.items() if ref_cnt[s] == 0]
        return min(free)[2] if free else None

    def evict_one(self, reason: EvictReason = EvictReason.LOST) -> bool:
        """Evict the least valuable unreferenced checkpoint; False if none is free."""
        slot = self.victim()
        if slot is None:
            return False
        self._forget(slot, reason)
        self.pool.evict(slot)
        return True

    def admit(
        self,
        num_pending: int,
        kind: CheckpointKind,
        prefix: tuple[BlockHash, ...],
        boundary: int,
        key_hash: BlockHash,
        pending_below: int = 0,
        supersedes: frozenset[int] = frozenset(),
    ) -> tuple[CheckpointKind, int] | None:
        """Make room for a new checkpoint at ``boundary`` (``prefix``: the hashes of the blocks
        before it; ``key_hash``: its own; ``pending_below``: the deepest save of the same
        request below it, not keyed yet; ``supersedes``: checkpoints it may replace), evicting
        only what leaves the book worth more (``checkpoint_admission``).
        Returns the kind and hits it starts with (a ghost's: what it was made as first), or
        None when it is refused (counted)."""
        ghost = self.ghosts.take(key_hash)
        hits = 0
        if ghost is None:
            self.rates.offer(kind, 0)
        else:
            kind, hits = ghost.kind, ghost.hits
        if self.capacity is None or self.count() + num_pending < self.capacity:
            return kind, hits
        new = Newcomer(
            kind, self.rates.expected(kind, hits), prefix, boundary, pending_below, supersedes
        )
        while self.count() + num_pending >= self.capacity:
            slot = admission_victim(self, new)
            if slot is None:
                self.counters.count_refused(kind)
                self.ghosts.remember(key_hash, kind, hits)
                return None
            own = slot in supersedes and supersedable(self, slot)
            reason = EvictReason.SUPERSEDED if own else EvictReason.VALUE
            self._forget(slot, reason)
            self.pool.evict(slot)
        return kind, hits

    def parent(self, prefix: tuple[BlockHash, ...]) -> int | None:
        """The slot of the deepest cached checkpoint on ``prefix`` (None: none)."""
        for h in reversed(prefix):
            slot = self.by_hash.get(h)
            if slot is not None:
                return slot
        return None

    def is_free(self, slot: int) -> bool:
        return self.pool.ref_cnt[slot] == 0

    def free_unkeyed(self, n: int) -> None:
        """Make ``n`` free slots carry no key, evicting by value (not the pool's LRU)."""
        self.prune()
        while self.pool.num_free - self.num_free_keyed() < n and self.evict_one(EvictReason.SLOT):
            pass
