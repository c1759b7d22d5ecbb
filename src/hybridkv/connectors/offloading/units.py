"""Restore units: what one holds, how its parts are keyed, and the plain data that names them.

A unit ends at T = kC (C = ``chunk_tokens``) and is keyed by the block hash at T (which covers
every token before T) in the tier of one layout fingerprint. It has one part per group::

    tokens        T-C ............. T
    full          [ blocks (T-C)/B .. T/B )            the chunk's own blocks
    sliding (W)   [ blocks max(0, T-W+1)/B .. T/B )    the window the token at T attends to
    state         the state exactly at T

Resuming at T after a local hit L needs the full parts of every unit ending in (L, T] and the
sliding and state parts of the unit ending at T only.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, SpecKind


class UnitGeometry:
    """Part shapes of a layout's units (computed once)."""

    def __init__(self, layout: KVCacheLayout, chunk_tokens: int) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self.chunk_tokens = chunk_tokens
        self.blocks_per_unit = chunk_tokens // layout.block_size
        self.has_state = bool(layout.state_group_ids)
        self.full_attention_only = all(g.kind is SpecKind.FULL for g in layout.groups)

    def unit_hash(self, hashes: list[BlockHash], end: int) -> BlockHash:
        return hashes[end // self.block_size - 1]

    def first_block(self, group_id: int, end: int) -> int:
        """Table index of the first block of the group's part of the unit ending at ``end``."""
        spec = self.layout.groups[group_id].spec
        if isinstance(spec, SlidingWindowSpec):
            return max(0, end - spec.sliding_window + 1) // self.block_size
        return (end - self.chunk_tokens) // self.block_size

    def part_blocks(self, group_id: int, end: int) -> range:
        """Table indices an attention group's part holds (empty for state groups)."""
        if self.layout.groups[group_id].kind is SpecKind.STATE:
            return range(0)
        return range(self.first_block(group_id, end), end // self.block_size)

    def part_nbytes(self, group_id: int, end: int) -> int:
        if self.layout.groups[group_id].kind is SpecKind.STATE:
            return self.layout.state_slot_bytes(group_id)
        return len(self.part_blocks(group_id, end)) * self.layout.page_bytes

    def unit_nbytes(self, end: int) -> int:
        return sum(self.part_nbytes(g.group_id, end) for g in self.layout.groups)

    def steady_part_sizes(self) -> list[int]:
        """Part sizes of a unit past every window (the size most units have): the attention
        parts as a CPU-tier snapshot allocates them, then the state parts."""
        windows = [
            g.spec.sliding_window
            for g in self.layout.groups
            if isinstance(g.spec, SlidingWindowSpec)
        ]
        end = (max(windows, default=0) // self.chunk_tokens + 1) * self.chunk_tokens
        return [self.part_nbytes(g.group_id, end) for g in self.layout.groups]

    def part_span(self, group_id: int, end: int) -> tuple[int, int]:
        blocks = self.part_blocks(group_id, end)
        return (blocks.start * self.block_size, end) if blocks else (end, end)

    def unit_end_of_block(self, k: int) -> int:
        """End of the unit whose chunk holds table index ``k``."""
        return (k // self.blocks_per_unit + 1) * self.chunk_tokens


def part_key(unit_hash: BlockHash, group_id: int) -> str:
    """The name of a part inside its fingerprint's directory (and in file headers)."""
    return f"{unit_hash.hex()}.g{group_id}"


@dataclass(frozen=True, slots=True)
class UnitSave:
    """Store one unit (an entry of ``ConnectorMetadata.saves``): per attention group the block
    ids of its part (``UnitGeometry.part_blocks`` order), per state group the live slot holding
    the state at ``end``; ``tiers`` were reserved for it by the scheduler half."""

    request_id: str
    unit_hash: BlockHash
    end: int
    block_ids: tuple[tuple[int, ...], ...]
    state_slots: tuple[int, ...]
    tiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnitPromotion:
    """Copy a unit a slower tier holds into a faster one (an entry of ``ConnectorMetadata.
    saves``): the scheduler half reserved it in ``target`` and pinned it in ``source``; the
    worker reads every part from ``source``, verified, commits it to ``target`` and unpins."""

    unit_hash: BlockHash
    end: int
    source: str
    target: str
    source_pin: int | None = None  # the serial of the source entry pinned


@dataclass(frozen=True, slots=True)
class UnitSource:
    """Where a load reads the unit ending at ``end`` from (pinned there until it finishes)."""

    end: int
    unit_hash: BlockHash
    tier: str | None  # None: no tier held the unit any more when it was pinned
    pin: int | None = None  # the serial of the entry pinned (``TierIndex.pin``)


@dataclass(frozen=True, slots=True)
class OffloadLoadKeys:
    """``LoadSpec.keys``: the units the load reads, in token order."""

    units: tuple[UnitSource, ...]
