"""The prefix map's changes as cache events: what KV-event publishers read (no torch, no I/O).

Each ``BlockPool`` records ``PoolEvent``s per id; this log turns them into per-key events a
subscriber can index::

    pool events   STORED id 7 (h, g)   STORED id 9 (h, g)   REMOVED id 7   REMOVED id 9
    cache events  STORED (h, g)        -                    -              REMOVED (h, g)

A key is announced when its first id is cached and withdrawn when its last id leaves, so the
keys announced and not withdrawn are exactly the pool's ``cached`` map. A stored key carries
the request whose ``block_hashes`` hold it (the publisher reads its tokens and parent hash
there): the coordinator calls ``tag(req)`` right after the calls that cache blocks of ``req``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hybridkv.kv.block_pool import BlockPool, CacheKey, EventKind, PoolEvent
from hybridkv.kv.hashing import BlockHash


class HasBlockHashes(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def block_hashes(self) -> list[BlockHash]: ...


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """A key entered (STORED) or left (REMOVED) the device prefix map, or the map was
    cleared (CLEARED, ``key`` None). ``request`` holds a STORED key in its ``block_hashes``
    (None if the key was cached outside a tagged call)."""

    kind: EventKind
    key: CacheKey | None = None
    request: HasBlockHashes | None = None


class KVEventLog:
    """Drains the pools' ``PoolEvent``s into ``CacheEvent``s, one per key change."""

    def __init__(self, pools: list[BlockPool]) -> None:
        self.pools = pools
        self._copies: dict[CacheKey, int] = {}  # ids cached under each key, every pool
        self._events: list[CacheEvent] = []

    def tag(self, request: HasBlockHashes | None) -> None:
        """Drain every pool now; keys stored since the last drain belong to ``request``."""
        for pool in self.pools:
            if pool.events:
                self._convert(pool.take_events(), request)

    def take(self) -> list[CacheEvent]:
        """This step's events, oldest first (a drain without a request first)."""
        self.tag(None)
        events, self._events = self._events, []
        return events

    def _convert(self, pool_events: list[PoolEvent], request: HasBlockHashes | None) -> None:
        copies, out = self._copies, self._events
        for ev in pool_events:
            kind, key = ev.kind, ev.key
            if kind is EventKind.CLEARED or key is None:
                self._clear(out)
            elif kind is EventKind.STORED:
                n = copies.get(key, 0)
                copies[key] = n + 1
                if n == 0:
                    out.append(CacheEvent(EventKind.STORED, key, request))
            else:
                n = copies.pop(key, 0)
                if n > 1:
                    copies[key] = n - 1
                elif n == 1:
                    out.append(CacheEvent(EventKind.REMOVED, key))

    def _clear(self, out: list[CacheEvent]) -> None:
        """One pool was reset: its keys are gone (a reset clears every pool in turn, so the
        map is empty once each pool reported; the log says CLEARED once per reset)."""
        cached = {key for pool in self.pools for key in pool.cached}
        self._copies = {k: n for k, n in self._copies.items() if k in cached}
        if not out or out[-1].kind is not EventKind.CLEARED:
            out.append(CacheEvent(EventKind.CLEARED))

    def cached_keys(self) -> set[CacheKey]:
        """The keys announced and not withdrawn (equals the pools' maps after ``take``)."""
        return set(self._copies)
