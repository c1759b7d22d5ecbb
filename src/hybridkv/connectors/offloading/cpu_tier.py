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
from hybridkv.connectors.file_format import MISSING, PartError
from hybridkv.connectors.offloading.policies import create_policy
from hybridkv.connectors.offloading.tier import TierIndex, UnitState
from hybridkv.kv.hashing import BlockHash
from hybridkv.native import PageCopy

# Measured (docs/benchmarks.md, B4): copies run faster in big calls and a segment verified
# right after its copy is still in cache up to several MiB, so segments are a few MiB; a load
# of one unit part still has several segments to share between two threads.
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

    @classmethod
    def gather(cls, cache: KVCacheAccess, block_ids: list[int], kernel: PageCopy) -> CpuPart:
        """Copy ``block_ids``' pages out of the device cache, checksumming in the same pass."""
        pages = cache.page_table()
        assert pages is not None, "gather needs a cache with a page table"
        data = torch.empty((len(block_ids), pages.num_groups, pages.page_bytes), dtype=torch.uint8)
        array: np.ndarray[Any, Any] = data.numpy()  # [n, G, page]
        blocks = np.asarray(block_ids, dtype=np.int64)
        rows = rows_per_segment(pages.num_groups * pages.page_bytes)
        sums = tuple(
            kernel.gather(array[lo : lo + rows], pages, blocks[lo : lo + rows])
            for lo in range(0, len(blocks), rows)
        )
        return cls(data, array, rows, sums, kernel)

    def segment(self, index: int) -> np.ndarray[Any, Any]:
        return self.array[index * self.rows_per_segment : (index + 1) * self.rows_per_segment]

    def verify(self, index: int) -> bool:
        """Whether segment ``index``'s bytes still match the checksum taken at store time."""
        return checksum(self.kernel, self.segment(index)) == self.checksums[index]

    def verify_all(self) -> bool:
        return all(self.verify(s) for s in range(len(self.checksums)))

    def load_segment(
        self, index: int, rows: list[int], block_ids: list[int], cache: KVCacheAccess
    ) -> bool:
        """Write rows ``rows`` (of the part) of segment ``index`` into ``block_ids`` and verify
        the whole segment: whether it matched. The blocks are written either way."""
        pages = cache.page_table() if self.kernel is not None else None
        segment, first = self.segment(index), index * self.rows_per_segment
        if self.kernel is None or pages is None:
            write_rows(cache, segment, [r - first for r in rows], block_ids)
            return self.verify(index)
        blocks = np.full(len(segment), -1, dtype=np.int64)  # -1: checksummed, not written
        blocks[np.asarray(rows, dtype=np.int64) - first] = block_ids
        return self.kernel.scatter(segment, pages, blocks) == self.checksums[index]


def write_rows(cache: KVCacheAccess, payload: Any, rows: list[int], block_ids: list[int]) -> None:
    """Rows ``rows`` of ``payload`` (``[n, G, page]`` uint8, numpy or CPU tensor) into
    ``block_ids``, one copy per contiguous run of rows."""
    data = np.asarray(payload)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        data = data[rows[0] : rows[0] + len(rows)]  # a contiguous run: no gather
    else:
        data = data[rows]
    cache.write_blocks(block_ids, data)


class CpuTier:
    name = "cpu"

    def __init__(
        self, capacity: int, eviction: str, unit_bytes: int, kernel: PageCopy | None
    ) -> None:
        self.index = TierIndex("cpu", capacity, create_policy(eviction, capacity // unit_bytes))
        self.kernel = kernel

    def snapshot(self, cache: KVCacheAccess, block_ids: list[int]) -> CpuPart | None:
        """The pages of ``block_ids`` copied and checksummed in one pass, or None if this
        tier or cache has no native kernel (the caller copies, ``store`` checksums)."""
        if self.kernel is None or cache.page_table() is None:
            return None
        return CpuPart.gather(cache, block_ids, self.kernel)

    def store(self, unit_hash: BlockHash, parts: dict[int, CpuPart | torch.Tensor]) -> bool:
        """Checksum (if not done yet) and commit a reserved unit's parts; False if the
        reservation is gone."""
        sealed = {
            gid: p if isinstance(p, CpuPart) else CpuPart.seal(p, self.kernel)
            for gid, p in parts.items()
        }
        return self.index.commit(unit_hash, sealed)

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
