"""The CPU tier: unit parts as CPU tensors, checksummed (xxh3-64) per segment, verified on load.

A part is the snapshot ``save()`` took from the device cache (attention parts
``[n, G, layer_page_bytes]`` uint8, state parts ``[slot_bytes]`` uint8), kept as is. Storing
checksums it in segments of whole rows of dim 0 (at most ``SEGMENT_BYTES`` each, at least one
row), so a load can copy a segment to the device and verify the same bytes right after, while
they are still in cache, and two threads can each take their own segments. The checksums
never leave the process, so their layout may change freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from hybridkv.connectors.file_format import MISSING, PartError
from hybridkv.connectors.offloading.policies import create_policy
from hybridkv.connectors.offloading.tier import TierIndex, UnitState
from hybridkv.kv.hashing import BlockHash

# Measured (docs/benchmarks.md, B4): a copy into the device cache runs faster in big calls
# (a 1-row segment copies at ~60 % of a 16-row one), and a segment hashed right after its
# copy hashes at cache speed up to several MiB (L2 and L3), so segments are a few MiB.
SEGMENT_BYTES = 4 << 20


def checksum(array: np.ndarray[Any, Any]) -> int:
    buffer: Any = array  # C-contiguous (a BufferError otherwise)
    return int(xxhash.xxh3_64_intdigest(memoryview(buffer)))


@dataclass(frozen=True, slots=True)
class CpuPart:
    """A stored part: ``array`` shares ``data``'s memory; ``checksums[s]`` covers rows
    ``[s * rows_per_segment, (s + 1) * rows_per_segment)`` of dim 0 (bytes, for 1-d parts)."""

    data: torch.Tensor
    array: np.ndarray[Any, Any]
    rows_per_segment: int
    checksums: tuple[int, ...]

    @classmethod
    def seal(cls, data: torch.Tensor) -> CpuPart:
        data = data.contiguous()
        array: np.ndarray[Any, Any] = data.numpy()
        row_bytes = max(1, array[:1].nbytes)
        rows = max(1, SEGMENT_BYTES // row_bytes)
        sums = tuple(checksum(array[lo : lo + rows]) for lo in range(0, len(array), rows))
        return cls(data, array, rows, sums)

    def segment_of(self, row: int) -> int:
        return row // self.rows_per_segment

    def verify(self, segment: int) -> bool:
        """Whether segment ``segment``'s bytes still match the checksum taken at store time."""
        lo = segment * self.rows_per_segment
        return checksum(self.array[lo : lo + self.rows_per_segment]) == self.checksums[segment]

    def verify_all(self) -> bool:
        return all(self.verify(s) for s in range(len(self.checksums)))


class CpuTier:
    name = "cpu"

    def __init__(self, capacity: int, eviction: str, unit_bytes: int) -> None:
        self.index = TierIndex("cpu", capacity, create_policy(eviction, capacity // unit_bytes))

    def store(self, unit_hash: BlockHash, parts: dict[int, torch.Tensor]) -> bool:
        """Checksum and commit a reserved unit's parts; False if the reservation is gone."""
        sealed = {gid: CpuPart.seal(data) for gid, data in parts.items()}
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
