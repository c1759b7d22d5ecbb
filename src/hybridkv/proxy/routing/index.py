"""``EngineIndex``: what one engine holds, rebuilt from its KV events.

::

    key  (medium, group, block hash)   "GPU" keys carry their group; tier units ("CPU",
                                        "DISK", "REMOTE") hold every group: group None
    BlockStored    keys added (most recent last)
    BlockRemoved   keys dropped
    AllBlocksCleared  everything dropped (the engine re-announces what its tiers still hold)

A state group's key is a checkpoint at that block's end (the events' ``mamba`` kind), so a
prefix resumes from that group only where its key is held. Memory is bounded: past
``max_entries`` the least recently stored key is forgotten and counted (the router then
under-predicts that engine, never over-predicts).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hybridkv.kv_events.schema import (
    MEDIUM_DEVICE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

IndexKey = tuple[str, int | None, bytes | int]  # (medium, group or None, block hash)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One KV cache group of an engine, as its events or its info route describe it."""

    kind: str  # "full_attention", "sliding_window" or "mamba" (every recurrent state)
    sliding_window: int | None = None


@dataclass(slots=True)
class IndexStats:
    num_batches: int = 0
    num_events: int = 0
    num_evictions: int = 0  # keys forgotten past max_entries (LRU)
    num_clears: int = 0  # AllBlocksCleared received, or the engine found restarted / down
    num_unknown_removals: int = 0  # a removed key the index did not hold (evicted, or missed)


class EngineIndex:
    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"the index bound must be >= 1 entry, got {max_entries}")
        self.max_entries = max_entries
        self._keys: OrderedDict[IndexKey, None] = OrderedDict()
        self.groups: dict[int, GroupInfo] = {}  # learned from the events' group fields
        self.tier_media: set[str] = set()  # every medium other than the device's seen stored
        self._counts: dict[str, int] = {}  # keys per medium (kept as keys come and go)
        self.stats = IndexStats()

    def __len__(self) -> int:
        return len(self._keys)

    def holds(self, medium: str, group: int | None, block_hash: bytes | int) -> bool:
        return (medium, group, block_hash) in self._keys

    def media(self) -> set[str]:
        """Every medium with at least one key."""
        return {m for m, n in self._counts.items() if n}

    def count(self, medium: str) -> int:
        return self._counts.get(medium, 0)

    def clear(self) -> None:
        self._keys.clear()
        self._counts.clear()
        self.stats.num_clears += 1

    def apply(self, batch: KVEventBatch) -> None:
        """One decoded batch, in order."""
        self.stats.num_batches += 1
        self.stats.num_events += len(batch.events)
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                self._remove(event)
            elif isinstance(event, AllBlocksCleared):
                self.clear()

    def _store(self, event: BlockStored) -> None:
        medium = event.medium or MEDIUM_DEVICE
        group = event.group_idx if medium == MEDIUM_DEVICE else None
        if medium != MEDIUM_DEVICE:
            self.tier_media.add(medium)
        if group is not None and event.kv_cache_spec_kind is not None:
            info = GroupInfo(event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window)
            self.groups[group] = info
        keys, counts = self._keys, self._counts
        for block_hash in event.block_hashes:
            key = (medium, group, block_hash)
            if key in keys:
                keys.move_to_end(key)
            else:
                keys[key] = None
                counts[medium] = counts.get(medium, 0) + 1
        while len(keys) > self.max_entries:
            (gone, _, _), _ = keys.popitem(last=False)
            counts[gone] -= 1
            self.stats.num_evictions += 1

    def _remove(self, event: BlockRemoved) -> None:
        medium = event.medium or MEDIUM_DEVICE
        group = event.group_idx if medium == MEDIUM_DEVICE else None
        keys = self._keys
        for block_hash in event.block_hashes:
            key = (medium, group, block_hash)
            if key in keys:
                del keys[key]
                self._counts[medium] -= 1
            else:
                self.stats.num_unknown_removals += 1
