"""Residency of restore units in one tier: states, pins, byte accounting, eviction.

The tier owns the fact "unit U is here" (architecture principle 7). Both connector halves
share it under one lock, with a split of duties that keeps lookups honest::

    scheduler thread   lookups, pin/unpin (loads), reserve (stores, and units another process
                       wrote to disk; the only place that evicts), commit (of those adoptions)
    worker threads     commit / abort reservations, remove units found bad

Eviction only happens in ``reserve``, which the scheduler half calls while planning saves and
adopting disk units in ``build_connector_meta`` — never between a lookup and the pin its load
takes in ``update_state_after_alloc`` — so a unit a lookup reported can still be served. A
reserved unit is PENDING (lookups answer "ask later") until the worker commits it; a failed
store is aborted and never becomes visible.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hybridkv.connectors.offloading.policies import BaseEvictionPolicy, Rank
from hybridkv.kv.hashing import BlockHash

_SERIALS = itertools.count(1)


class UnitState(str, Enum):
    PENDING = "pending"  # reserved, being stored
    READY = "ready"


@dataclass(slots=True)
class ResidentUnit:
    unit_hash: BlockHash
    end: int
    nbytes: int
    parent: BlockHash | None = None  # the unit ending C tokens earlier (None: first or unknown)
    state: UnitState = UnitState.PENDING
    pins: int = 0
    parts: dict[int, Any] = field(default_factory=dict)  # group id -> tier-specific part
    # this entry (a unit dropped and stored again is a new entry): pins name it
    serial: int = field(default_factory=lambda: next(_SERIALS))


class TierIndex:
    def __init__(self, name: str, capacity: int, policy: BaseEvictionPolicy) -> None:
        self.name = name
        self.capacity = capacity
        self.policy = policy
        self.lock = threading.RLock()
        self.entries: dict[BlockHash, ResidentUnit] = {}
        self.used = 0  # bytes of every entry, pending ones included
        self.children: dict[BlockHash, set[BlockHash]] = {}  # parent -> resident children
        # resident units whose parent unit is not resident, in the order they became so
        self.orphans: dict[BlockHash, None] = {}
        # told (under the lock: must not block) when a unit becomes READY (True) and when a
        # READY unit leaves (False): the KV events of this tier
        self.listener: Callable[[ResidentUnit, bool], None] | None = None

    # -- queries -------------------------------------------------------------------------

    def state_of(self, unit_hash: BlockHash) -> UnitState | None:
        with self.lock:
            entry = self.entries.get(unit_hash)
            return None if entry is None else entry.state

    def get(self, unit_hash: BlockHash) -> ResidentUnit | None:
        with self.lock:
            return self.entries.get(unit_hash)

    def num_pinned(self) -> int:
        with self.lock:
            return sum(1 for e in self.entries.values() if e.pins)

    def num_pending(self) -> int:
        with self.lock:
            return sum(1 for e in self.entries.values() if e.state is UnitState.PENDING)

    def check_accounting(self) -> None:
        with self.lock:
            total = sum(e.nbytes for e in self.entries.values())
            assert total == self.used, f"{self.name}: used={self.used}, entries hold {total}"
            assert self.used <= self.capacity, f"{self.name}: {self.used} > {self.capacity}"
            assert set(self.policy.candidates()) == set(self.entries), f"{self.name}: policy"

    # -- scheduler thread ----------------------------------------------------------------

    def reserve(
        self, unit_hash: BlockHash, end: int, nbytes: int, parent: BlockHash | None = None
    ) -> list[ResidentUnit] | None:
        """Make room and add a PENDING entry; returns the evicted entries, or None (nothing
        changed) if the unit is known already or pinned/pending units leave too little room."""
        with self.lock:
            if unit_hash in self.entries or nbytes > self.capacity:
                return None
            victims = self._pick_victims(nbytes - (self.capacity - self.used))
            if victims is None:
                return None
            for entry in victims:
                self._drop(entry.unit_hash, evicted=True)
            self.entries[unit_hash] = ResidentUnit(unit_hash, end, nbytes, parent)
            self.used += nbytes
            if parent is not None:
                siblings = self.children.setdefault(parent, set())
                siblings.add(unit_hash)
                if parent not in self.entries:
                    self.orphans[unit_hash] = None
                elif len(siblings) == 2:
                    self.policy.share(parent)
            for child in self.children.get(unit_hash, ()):
                self.orphans.pop(child, None)
            self.policy.insert(unit_hash)
            return victims

    def victims_rank(self, nbytes: int) -> Rank | None:
        """The highest rank (``BaseEvictionPolicy.rank``) among the units a reservation of
        ``nbytes`` would evict now, orphans left out (they go first whatever their rank: a
        lookup reaches them only past a local hit); None if it would not fit. Changes
        nothing."""
        with self.lock:
            victims = self._pick_victims(nbytes - (self.capacity - self.used))
            if victims is None:
                return None
            ranks = [
                self.policy.rank(v.unit_hash) for v in victims if v.unit_hash not in self.orphans
            ]
            return max(ranks, default=(-1, float("-inf")))

    def _pick_victims(self, need: int) -> list[ResidentUnit] | None:
        """Evictable units freeing ``need`` bytes: only leaves (no resident child unit), so a
        prefix loses its tail before its head; orphans (parent gone) first, then policy
        order. A parent passed over for its children is taken as soon as they are picked.

        The walk starts at the first candidates and stops once it has room, so its cost is
        the victims plus the units it skips (pinned, being stored, parents of unpicked
        children) -- not the tier's size (issue 18: a full scan per store took 243 ms at
        80k units)."""
        if need <= 0:
            return []
        picked: dict[BlockHash, ResidentUnit] = {}
        passed: set[BlockHash] = set()  # READY, unpinned, skipped for a resident child
        for key in itertools.chain(self.orphans, self.policy.iter_candidates()):
            entry = self.entries.get(key)  # type: ignore[call-overload]
            if entry is None or entry.unit_hash in picked:
                continue
            if not self._evictable(entry, picked):
                if not entry.pins and entry.state is UnitState.READY:
                    passed.add(entry.unit_hash)
                continue
            while entry is not None and need > 0:
                picked[entry.unit_hash] = entry
                need -= entry.nbytes
                parent = entry.parent  # a parent passed over may be a leaf now
                entry = None
                if parent in passed and self._evictable(self.entries[parent], picked):
                    passed.discard(parent)
                    entry = self.entries[parent]
            if need <= 0:
                return list(picked.values())
        return None

    def _evictable(self, entry: ResidentUnit, picked: dict[BlockHash, ResidentUnit]) -> bool:
        if entry.pins or entry.state is not UnitState.READY:
            return False
        return all(c in picked for c in self.children.get(entry.unit_hash, ()))

    def pin(self, unit_hash: BlockHash) -> int | None:
        """Pin a READY unit; the entry's serial (give it back to ``unpin``), or None."""
        with self.lock:
            entry = self.entries.get(unit_hash)
            if entry is None or entry.state is not UnitState.READY:
                return None
            entry.pins += 1
            return entry.serial

    def unpin(self, unit_hash: BlockHash, serial: int | None) -> None:
        """Release a pin of the entry ``serial`` (``pin``'s answer). A late unpin of an
        entry that was dropped meanwhile releases nothing, not a newer entry's pin."""
        with self.lock:
            entry = self.entries.get(unit_hash)
            if entry is not None and entry.serial == serial and entry.pins > 0:
                entry.pins -= 1

    def touch(self, unit_hash: BlockHash, reuse: bool = False) -> None:
        with self.lock:
            if unit_hash in self.entries:
                self.policy.touch(unit_hash, reuse)

    def resume(self, unit_hash: BlockHash) -> None:
        """A load resumes at this unit (the deepest it reads): a hit for ``ValuePolicy``."""
        with self.lock:
            if unit_hash in self.entries:
                self.policy.resume(unit_hash)

    # -- worker threads ------------------------------------------------------------------

    def commit(self, unit_hash: BlockHash, parts: dict[int, Any]) -> bool:
        """A reserved unit's bytes are stored: it becomes READY. False if it was dropped."""
        with self.lock:
            entry = self.entries.get(unit_hash)
            if entry is None or entry.state is not UnitState.PENDING:
                return False
            entry.parts = parts
            entry.state = UnitState.READY
            if self.listener is not None:
                self.listener(entry, True)
            return True

    def abort(self, unit_hash: BlockHash) -> None:
        """A reserved unit's store failed or was skipped: it never becomes visible."""
        with self.lock:
            entry = self.entries.get(unit_hash)
            if entry is not None and entry.state is UnitState.PENDING:
                self._drop(unit_hash, evicted=False)

    def remove(self, unit_hash: BlockHash) -> ResidentUnit | None:
        """Forget a unit whose bytes are bad or gone (pins do not protect it: its loads fail)."""
        with self.lock:
            if unit_hash not in self.entries:
                return None
            return self._drop(unit_hash, evicted=False)

    def clear(self) -> list[ResidentUnit]:
        """Forget every unit that is neither pinned nor pending (a reset)."""
        with self.lock:
            gone = [e for e in self.entries.values() if not e.pins and e.state is UnitState.READY]
            for entry in gone:
                self._drop(entry.unit_hash, evicted=False)
            return gone

    def ready_entries(self) -> list[ResidentUnit]:
        """The READY units now (a snapshot, for KV events)."""
        with self.lock:
            return [e for e in self.entries.values() if e.state is UnitState.READY]

    def _drop(self, unit_hash: BlockHash, evicted: bool) -> ResidentUnit:
        entry = self.entries.pop(unit_hash)
        if self.listener is not None and entry.state is UnitState.READY:
            self.listener(entry, False)
        self.used -= entry.nbytes
        self.orphans.pop(unit_hash, None)
        for child in self.children.get(unit_hash, ()):
            self.orphans[child] = None
        if entry.parent is not None:
            siblings = self.children.get(entry.parent)
            if siblings is not None:
                siblings.discard(unit_hash)
                if not siblings:
                    del self.children[entry.parent]
        self.policy.remove(unit_hash, evicted)
        return entry
