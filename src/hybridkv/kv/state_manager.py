"""State slots of one state group: live slots and checkpoints at block boundaries.

Slot life cycles (all slots come from the group's own pool)::

    live        one per running request, allocated at admission, freed at finish/preemption
    checkpoint  state exactly at a boundary T, keyed by (block hash at T, group); unreferenced
                and evictable by value once its save step completed
    pending     a save made this step: keyed (becomes a checkpoint) when the step's KV is final
    trailing    one per request: the state at the last boundary it passed that was not due a
                checkpoint; keyed when the request is freed (the next turn of a conversation
                resumes there), overwritten when it passes the next boundary
    held        the checkpoint a request restored at admission: referenced until the request
                is freed (never evicted while it runs; a preempted request resumes there)

Checkpoints (pending ones included) are bounded by the group's ``CheckpointBook``, which also
picks which one to evict (by value, not the pool's LRU). The manager never touches tensors: it
returns ``StateCopy`` records for the runner; a copy with ``at`` set is taken from inside the
step's chunked scan (the state after ``at`` tokens), not from the live slot after the step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hybridkv.kv.block_pool import BlockPool, CacheKey
from hybridkv.kv.checkpoint_book import CheckpointBook
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import StateSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StateCopy:
    """Copy one state slot onto another within a state group (all the group's layers).

    ``at`` (saves only): the state after token position ``at`` of the request whose live slot
    is ``src_slot``, a block boundary strictly inside the step, taken from the scan; None: the
    live slot after the step."""

    group_id: int
    src_slot: int
    dst_slot: int
    at: int | None = None


@dataclass(frozen=True, slots=True)
class _Pending:
    slot: int
    boundary: int
    kind: CheckpointKind
    hits: int  # a ghost's hits, carried over when it is made again


@dataclass(slots=True)
class _Trailing:
    slot: int
    boundary: int
    final: bool


class StateManager:
    def __init__(
        self,
        group_id: int,
        spec: StateSpec,
        num_slots: int,
        block_size: int,
        max_checkpoints: int | None = None,
    ) -> None:
        self.group_id = group_id
        self.spec = spec
        self.block_size = block_size
        self.pool = BlockPool(num_slots, with_null=False, name=f"state group {group_id}")
        self.book = CheckpointBook(self.pool, max_checkpoints)
        self.live: dict[str, int] = {}
        self.pending: dict[str, list[_Pending]] = {}
        self.trailing: dict[str, _Trailing] = {}
        self.held: dict[str, int] = {}
        self.latest: dict[str, tuple[int, CacheKey]] = {}  # a request's deepest own save
        self._warned_budget = False

    def _key(self, hashes: list[BlockHash], boundary: int) -> CacheKey:
        return (hashes[boundary // self.block_size - 1], self.group_id)

    # -- hit search (pure) ---------------------------------------------------------------

    def longest_hit(self, hashes: list[BlockHash], max_blocks: int) -> int:
        """The largest k <= max_blocks with a checkpoint exactly at k blocks (0 if none)."""
        prefix = self.pool.cached.group(self.group_id)
        for k in range(max_blocks, 0, -1):
            if hashes[k - 1] in prefix:
                return k
        return 0

    def hit_slot(self, hashes: list[BlockHash], num_blocks: int) -> int | None:
        if num_blocks == 0:
            return None
        return self.pool.get_cached((hashes[num_blocks - 1], self.group_id))

    # -- admission -----------------------------------------------------------------------

    def num_slots_needed(self, req_id: str, hit_slot: int | None) -> int:
        if req_id in self.live:
            return 0
        pin_cost = 1 if hit_slot is not None and self.pool.is_free_cached(hit_slot) else 0
        return 1 + pin_cost

    def add_request(
        self,
        req_id: str,
        hit_slot: int | None,
        hashes: list[BlockHash] | None = None,
        num_overlap_blocks: int = 0,
    ) -> StateCopy | None:
        """Hold the checkpoint (if any) until the request is freed, give the request a live
        slot, return the restore. ``hashes`` and ``num_overlap_blocks`` (its prefix found in
        the attention cache) teach the book where requests resume."""
        self.book.arrive(hashes or [], num_overlap_blocks, hit_slot)
        if hit_slot is not None:
            self.pool.touch([hit_slot])
            self.held[req_id] = hit_slot
        self.live[req_id] = self._allocate()
        self._maybe_warn_budget()
        if hit_slot is None:
            return None
        return StateCopy(self.group_id, hit_slot, self.live[req_id])

    def _maybe_warn_budget(self) -> None:
        cap = self.book.capacity
        if cap is not None and len(self.live) > cap and not self._warned_budget:
            self._warned_budget = True
            logger.warning(
                "state group %d: the checkpoint budget holds %d checkpoints, fewer than the "
                "%d running requests: some prefixes will be recomputed (raise "
                "state_checkpoint_budget or kv_cache_memory)",
                self.group_id,
                cap,
                len(self.live),
            )

    # -- saves ---------------------------------------------------------------------------

    def _allocate(self) -> int:
        """One slot, evicting checkpoints by value (not LRU) if only keyed slots are free."""
        self.book.free_unkeyed(1)
        return self.pool.allocate(1, self.group_id)[0]

    def num_pending(self) -> int:
        return sum(len(saves) for saves in self.pending.values())

    def save(
        self,
        req_id: str,
        hashes: list[BlockHash],
        boundary: int,
        kind: CheckpointKind | None,
        at: int | None = None,
    ) -> StateCopy | None:
        """Plan a copy of the request's state at ``boundary``: the live slot after a step that
        ends there, or (``at``) the scan's state inside the step.

        Due boundaries (a ``kind``) become checkpoints; others overwrite the request's
        trailing slot (only at a step's end). Best effort: with no room nothing is saved.
        """
        if kind is not None:
            return self._save_checkpoint(req_id, hashes, boundary, kind, at)
        assert at is None, "only due boundaries are saved from inside a step"
        trailing = self.trailing.get(req_id)
        if trailing is None:
            if self.pool.num_free == 0:
                return None
            trailing = _Trailing(self._allocate(), boundary, False)
            self.trailing[req_id] = trailing
        trailing.boundary, trailing.final = boundary, False
        return StateCopy(self.group_id, self.live[req_id], trailing.slot)

    def _save_checkpoint(
        self,
        req_id: str,
        hashes: list[BlockHash],
        boundary: int,
        kind: CheckpointKind,
        at: int | None,
    ) -> StateCopy | None:
        if self.pool.get_cached(self._key(hashes, boundary)) is not None:
            return None
        self._drop_trailing(req_id)  # superseded by a newer checkpoint
        prefix = tuple(hashes[: boundary // self.block_size - 1])
        key = self._key(hashes, boundary)
        saves = self.pending.get(req_id, [])
        below = max((p.boundary for p in saves if p.boundary < boundary), default=0)
        admitted = self.book.admit(self.num_pending(), kind, prefix, boundary, key[0], below)
        if admitted is None:
            return None
        if self.pool.num_free == 0:
            self.book.counters.count_refused(kind)
            return None
        slot = self._allocate()
        self.pending.setdefault(req_id, []).append(_Pending(slot, boundary, *admitted))
        return StateCopy(self.group_id, self.live[req_id], slot, at)

    def _register(
        self, slot: int, hashes: list[BlockHash], boundary: int, kind: CheckpointKind, hits: int
    ) -> CacheKey:
        key = self._key(hashes, boundary)
        self.pool.cache(slot, key)
        prefix = tuple(hashes[: boundary // self.block_size - 1])
        self.book.add(slot, key, boundary, kind, prefix, hits)
        return key

    def confirm(self, req_id: str, hashes: list[BlockHash], num_tokens: int) -> None:
        """The request's state is final up to ``num_tokens``: publish the saves it covers."""
        keep = []
        for p in self.pending.pop(req_id, []):
            if p.boundary > num_tokens:
                keep.append(p)
                continue
            key = self._register(p.slot, hashes, p.boundary, p.kind, p.hits)
            self.latest[req_id] = (p.slot, key)
            self.pool.free([p.slot])
        if keep:
            self.pending[req_id] = keep
        trailing = self.trailing.get(req_id)
        if trailing is not None and trailing.boundary <= num_tokens:
            trailing.final = True

    # -- freeing -------------------------------------------------------------------------

    def free(self, req_id: str, hashes: list[BlockHash], turn: bool = False) -> None:
        """Free every slot of the request; a final trailing state becomes a checkpoint
        (``turn``: of a request that named boundaries, a chat turn's end)."""
        self.pool.free([p.slot for p in self.pending.pop(req_id, [])])
        trailing = self.trailing.pop(req_id, None)
        supersedes = self._superseded(req_id)
        if req_id in self.held:  # first: the checkpoint it resumed from may make way
            self.pool.free([self.held.pop(req_id)])
        if trailing is not None:
            kind = CheckpointKind.TURN_END if turn else CheckpointKind.FINISHED
            self._keep_trailing(trailing, hashes, kind, supersedes)
            self.pool.free([trailing.slot])
        if req_id in self.live:
            self.pool.free([self.live.pop(req_id)])

    def _superseded(self, req_id: str) -> frozenset[int]:
        """The checkpoints a request's last state may replace: its own deepest save (still
        keyed as it saved it) and the one it resumed from (``checkpoint_admission``)."""
        slots = set()
        latest = self.latest.pop(req_id, None)
        if latest is not None and self.pool.key[latest[0]] == latest[1]:
            slots.add(latest[0])
        if req_id in self.held:
            slots.add(self.held[req_id])
        return frozenset(slots)

    def _keep_trailing(
        self,
        trailing: _Trailing,
        hashes: list[BlockHash],
        kind: CheckpointKind,
        supersedes: frozenset[int],
    ) -> None:
        """A finished request's last state becomes a checkpoint if the book admits it."""
        key = self._key(hashes, trailing.boundary)
        if not trailing.final or self.pool.get_cached(key) is not None:
            return
        prefix = tuple(hashes[: trailing.boundary // self.block_size - 1])
        admitted = self.book.admit(
            self.num_pending(), kind, prefix, trailing.boundary, key[0], 0, supersedes
        )
        if admitted is not None:
            self._register(trailing.slot, hashes, trailing.boundary, *admitted)

    def _drop_trailing(self, req_id: str) -> None:
        trailing = self.trailing.pop(req_id, None)
        if trailing is not None:
            self.pool.free([trailing.slot])

    def reset(self) -> bool:
        """Drop every checkpoint; only when no slot is referenced. Returns success."""
        if not self.pool.reset():
            return False
        self.book.prune()
        return True

    def check_budget(self) -> None:
        """Checkpoints (pending ones included) within the capacity; the book mirrors the keys."""
        count, keyed = self.book.count(), sum(1 for k in self.pool.key if k is not None)
        assert count == keyed, f"state group {self.group_id}: book has {count}, pool keys {keyed}"
        cap = self.book.capacity
        total = count + self.num_pending()
        assert cap is None or total <= cap, (
            f"state group {self.group_id}: {total} checkpoints exceed the budget of {cap}"
        )

    def held_refs(self) -> dict[int, int]:
        """References this manager holds on each slot (for integrity checks)."""
        refs: dict[int, int] = {}
        slots = [*self.live.values(), *self.held.values()]
        slots += [t.slot for t in self.trailing.values()]
        slots += [p.slot for saves in self.pending.values() for p in saves]
        for s in slots:
            refs[s] = refs.get(s, 0) + 1
        return refs
