"""The CPU tier: unit parts as CPU tensors, checksummed per segment, verified on load.

A part is the unit's bytes as taken from the device cache (attention parts
``[n, G, layer_page_bytes]`` uint8, state parts ``[slot_bytes]`` uint8). It is checksummed in
segments of whole rows of dim 0 (at most ``SEGMENT_BYTES`` each, at least one row), so a load
verifies exactly the segments it copies, and two threads can each take their own segments.

With the native kernels (``hybridkv.native``, the usual case) a checksum is taken in the same
pass as the copy: a snapshot gathers the device pages into the part while checksumming it,
and a load scatters a segment into its blocks while checksumming it, so each byte crosses
memory once, as in a plain copy. Without them (no C compiler) a copy is followed by an xxh3-64
pass over the same segment while it is still in cache. Checksums never leave the process,
and one tier uses one function for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from hybridkv.connectors.base import KVCacheAccess
from hybridkv.connectors.config import TierName
from hybridkv.connectors.offloading.policies import Eviction, create_policy
from hybridkv.connectors.offloading.tier import ResidentUnit, TierIndex, UnitState
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.tiers.cpu.host_buffers import HostBuffers
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.connectors.part_error import CORRUPT, MISSING, PartError
from hybridkv.kv.hashing import BlockHash
from hybridkv.native import PageCopy

# Measured (docs/benchmarks.md, B4): copies run faster in big segments, and without native
# kernels a segment verified right after its copy is still in cache up to several MiB; a load
# of one unit part still has several segments to share between threads.
SEGMENT_BYTES = 4 << 20


def checksum(kernel: PageCopy | None, array: np.ndarray[Any, Any]) -> int:
    if kernel is not None:
        return kernel.hash(array)
    buffer: Any = array  # C-contiguous (a BufferError otherwise)
    return int(xxhash.xxh3_64_intdigest(memoryview(buffer)))


def rows_per_segment(row_bytes: int) -> int:
    return max(1, SEGMENT_BYTES // max(1, row_bytes))


@dataclass(frozen=True, slots=True)
class CpuPart:
    """A stored part: ``array`` shares ``data``'s memory; ``checksums[s]`` covers rows
    ``[s * rows_per_segment, (s + 1) * rows_per_segment)`` of dim 0 (bytes, for 1-d parts),
    computed by ``kernel`` (xxh3-64 when it is None)."""

    data: torch.Tensor
    array: np.ndarray[Any, Any]
    rows_per_segment: int
    checksums: tuple[int, ...]
    kernel: PageCopy | None

    @classmethod
    def seal(cls, data: torch.Tensor, kernel: PageCopy | None) -> CpuPart:
        """Checksum a snapshot already taken."""
        data = data.contiguous()
        array: np.ndarray[Any, Any] = data.numpy()
        rows = rows_per_segment(array[:1].nbytes)
        sums = tuple(checksum(kernel, array[lo : lo + rows]) for lo in range(0, len(array), rows))
        return cls(data, array, rows, sums, kernel)

    def segment(self, index: int) -> np.ndarray[Any, Any]:
        return self.array[index * self.rows_per_segment : (index + 1) * self.rows_per_segment]

    def verify(self, index: int) -> bool:
        """Whether segment ``index``'s bytes still match the checksum taken at store time."""
        return checksum(self.kernel, self.segment(index)) == self.checksums[index]

    def verify_all(self) -> bool:
        return all(self.verify(s) for s in range(len(self.checksums)))

    def scatter_rows(self, index: int, rows: list[int], block_ids: list[int]) -> Any:
        """Segment ``index``'s block per row for ``PageCopy.scatter`` (-1: not written)."""
        blocks = np.full(len(self.segment(index)), -1, dtype=np.int64)
        blocks[np.asarray(rows, dtype=np.int64) - index * self.rows_per_segment] = block_ids
        return blocks


SegmentLoad = tuple[CpuPart, int, list[int], list[int]]  # part, segment, part rows, block ids


def load_segments(cache: KVCacheAccess, items: list[SegmentLoad]) -> list[bool]:
    """Write each item's rows into its blocks and verify each whole segment: whether each
    matched. With native kernels, in one call (checksummed in the copy's pass)."""
    pages = cache.page_table()
    kernel = items[0][0].kernel if items else None
    if kernel is None or pages is None or any(p.kernel is not kernel for p, *_ in items):
        verified = []
        for part, index, rows, block_ids in items:
            first = index * part.rows_per_segment
            write_rows(cache, part.segment(index), [r - first for r in rows], block_ids)
            verified.append(part.verify(index))
        return verified
    datas = [part.segment(index) for part, index, _, _ in items]
    blocks = [part.scatter_rows(index, rows, ids) for part, index, rows, ids in items]
    sums = kernel.scatter_many(datas, pages, blocks)
    return [s == p.checksums[i] for s, (p, i, _, _) in zip(sums, items, strict=True)]


def write_rows(cache: KVCacheAccess, payload: Any, rows: list[int], block_ids: list[int]) -> None:
    """Rows ``rows`` of ``payload`` (``[n, G, page]`` uint8, numpy or CPU tensor) into
    ``block_ids``, one copy per contiguous run of rows."""
    data = np.asarray(payload)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        data = data[rows[0] : rows[0] + len(rows)]  # a contiguous run: no gather
    else:
        data = data[rows]
    cache.write_blocks(block_ids, data)


class CpuIndex(TierIndex):
    """The tier's index: an evicted unit's buffers go back to ``buffers`` (an evicted unit is
    READY and unpinned: no load reads it, and no disk write-behind either, which pins it).
    Free buffers fit in the room that stored parts leave (reserved units hold no memory yet:
    their snapshots will take the buffers their reservations evicted)."""

    def __init__(self, capacity: int, eviction: Eviction, unit_bytes: int) -> None:
        super().__init__("cpu", capacity, create_policy(eviction, capacity // unit_bytes))
        self.buffers = HostBuffers()
        self.num_pending_bytes = 0

    def room(self) -> int:
        """Bytes neither stored parts nor free buffers may exceed together."""
        return self.capacity - (self.used - self.num_pending_bytes)

    def reserve(
        self, unit_hash: BlockHash, end: int, nbytes: int, parent: BlockHash | None = None
    ) -> list[ResidentUnit] | None:
        with self.lock:
            victims = super().reserve(unit_hash, end, nbytes, parent)
            if victims is not None:
                self.num_pending_bytes += nbytes
            return victims

    def commit(self, unit_hash: BlockHash, parts: dict[int, Any]) -> bool:
        with self.lock:
            committed = super().commit(unit_hash, parts)
            if committed:
                self.num_pending_bytes -= self.entries[unit_hash].nbytes
                self.buffers.trim(self.room())  # what the new unit did not take must fit
            return committed

    def _drop(self, unit_hash: BlockHash, evicted: bool) -> ResidentUnit:
        entry = super()._drop(unit_hash, evicted)
        if entry.state is UnitState.PENDING:
            self.num_pending_bytes -= entry.nbytes
        elif evicted:
            for part in entry.parts.values():
                if isinstance(part, CpuPart):
                    self.buffers.give(part.data, self.room())
        return entry


class CpuTier(Tier):
    """Parts in CPU memory: no I/O, so ``submit`` runs on the caller's thread, and loads copy
    the parts segment by segment (``in_memory``)."""

    name = TierName.CPU
    in_memory = True
    index: CpuIndex

    def __init__(
        self,
        capacity: int,
        eviction: Eviction,
        unit_bytes: int,
        kernel: PageCopy | None,
        geometry: UnitGeometry,
    ) -> None:
        self.index = CpuIndex(capacity, eviction, unit_bytes)
        self.kernel = kernel
        self.geometry = geometry

    def shutdown(self) -> None:
        """Free the tier's memory: every unit's parts (pinned ones too: a load still copying
        holds its own references) and the free buffers. Subscribers of KV events hear
        nothing: the engine that announced the units is ending."""
        index = self.index
        with index.lock:
            index.listener = None
            for unit_hash in list(index.entries):
                index.remove(unit_hash)
            index.buffers.trim(0)

    def preallocate(self, part_sizes: list[int]) -> int:
        """Fill the free buffers with sets of ``part_sizes`` (the parts of a typical unit),
        mapped and touched, up to the capacity; returns the bytes mapped."""
        with self.index.lock:
            return self.index.buffers.preallocate(part_sizes, self.index.room())

    def snapshot(
        self, cache: KVCacheAccess, ids_by_group: dict[int, list[int]]
    ) -> dict[int, CpuPart] | None:
        """Each group's blocks copied out of the device cache and checksummed in the same
        pass (one kernel call for the unit), or None if this tier or cache has no native
        kernel (the caller copies, ``store`` checksums)."""
        pages = cache.page_table()
        if self.kernel is None or pages is None:
            return None
        row_bytes = pages.num_groups * pages.page_bytes
        rows = rows_per_segment(row_bytes)
        arrays: dict[int, Any] = {}
        outs: list[Any] = []
        blocks: list[Any] = []
        for gid, ids in ids_by_group.items():
            data = self.index.buffers.take(len(ids) * row_bytes)
            arrays[gid] = data.numpy().reshape(len(ids), pages.num_groups, pages.page_bytes)
            ids_np = np.asarray(ids, dtype=np.int64)
            for lo in range(0, len(ids), rows):
                outs.append(arrays[gid][lo : lo + rows])
                blocks.append(ids_np[lo : lo + rows])
        sums = iter(self.kernel.gather_many(outs, pages, blocks))
        parts = {}
        for gid, array in arrays.items():
            num_segments = -(-len(array) // rows)
            checksums = tuple(next(sums) for _ in range(num_segments))
            parts[gid] = CpuPart(torch.from_numpy(array), array, rows, checksums, self.kernel)
        return parts

    def store(
        self, unit_hash: BlockHash, parts: dict[int, CpuPart | torch.Tensor], pins: int = 0
    ) -> int | None:
        """Checksum (if not done yet) and commit a reserved unit's parts, pinned ``pins``
        times (once per write-behind still reading them; each unpins with the serial
        returned); None if the reservation is gone."""
        sealed = {
            gid: p if isinstance(p, CpuPart) else CpuPart.seal(p, self.kernel)
            for gid, p in parts.items()
        }
        with self.index.lock:  # no eviction between the commit and the pin
            if not self.index.commit(unit_hash, sealed):
                return None
            entry = self.index.entries[unit_hash]
            entry.pins += pins
            return entry.serial

    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        """Commit a reserved unit (a promotion from a slower tier); 0 if the reservation is
        gone."""
        if self.store(unit_hash, parts) is None:
            return 0
        return sum(int(p.nbytes) if isinstance(p, torch.Tensor) else 0 for p in parts.values())

    def read(
        self, unit_hash: BlockHash, end: int, group_id: int, deadline: float | None = None
    ) -> torch.Tensor:
        stored = self.get(unit_hash, group_id)
        if not stored.verify_all():
            raise PartError(CORRUPT, "cpu checksum mismatch")
        return stored.data

    def get(self, unit_hash: BlockHash, group_id: int) -> CpuPart:
        """The stored part, **not verified yet**: the caller verifies every segment whose bytes
        it uses (``CpuPart.verify``) before reporting them loaded. ``PartError`` if it is gone.
        The tier never changes stored bytes; the caller must not either."""
        entry = self.index.get(unit_hash)
        if entry is None or entry.state is not UnitState.READY:
            raise PartError(MISSING, f"cpu unit {unit_hash.hex()}")
        part: Any = entry.parts.get(group_id)
        if not isinstance(part, CpuPart):
            raise PartError(MISSING, f"cpu unit {unit_hash.hex()} group {group_id}")
        return part
