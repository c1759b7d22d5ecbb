"""The prefix map of a pool: (block hash, group id) -> the ids cached under that key.

Stored per group, so hot loops (hit search, caching a table) look up a bare block hash in
their group's dict instead of building and hashing a ``(hash, group)`` tuple per block::

    by_group = {group id: {block hash: {id: None, ...}}}      # insertion-ordered id sets

As a read-only ``Mapping`` keyed by ``(hash, group)`` it reads like the flat dict it replaces.
A group's dict is created once and never replaced (``clear`` empties it in place), so callers
may keep a reference to it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hybridkv.kv.hashing import BlockHash

CacheKey = tuple[BlockHash, int]  # (block hash, group id)
IdSet = dict[int, None]


class PrefixMap(Mapping[CacheKey, IdSet]):
    __slots__ = ("by_group",)

    def __init__(self) -> None:
        self.by_group: dict[int, dict[BlockHash, IdSet]] = {}

    def group(self, group_id: int) -> dict[BlockHash, IdSet]:
        """The group's own map, keyed by block hash (live: it reflects later changes)."""
        found = self.by_group.get(group_id)
        if found is None:
            found = self.by_group[group_id] = {}
        return found

    def __getitem__(self, key: CacheKey) -> IdSet:
        return self.by_group[key[1]][key[0]]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        found = self.by_group.get(key[1])
        return found is not None and key[0] in found

    def __iter__(self) -> Iterator[CacheKey]:
        for g, found in self.by_group.items():
            for h in found:
                yield (h, g)

    def __len__(self) -> int:
        return sum(len(found) for found in self.by_group.values())

    def add(self, key: CacheKey, item_id: int) -> None:
        found = self.group(key[1])
        ids = found.get(key[0])
        if ids is None:
            found[key[0]] = {item_id: None}
        else:
            ids[item_id] = None

    def discard(self, key: CacheKey, item_id: int) -> None:
        """Forget ``item_id`` under ``key`` (KeyError if it is not there)."""
        found = self.by_group[key[1]]
        ids = found[key[0]]
        del ids[item_id]
        if not ids:
            del found[key[0]]

    def clear(self) -> None:
        for found in self.by_group.values():
            found.clear()
