"""The CPU tier: unit parts as CPU tensors, each with an xxh3-64 checksum verified on load.

A part is the snapshot ``save()`` took from the device cache (attention parts
``[n, G, layer_page_bytes]`` uint8, state parts ``[slot_bytes]`` uint8), kept as is: storing
costs one copy, loading one copy plus the checksum pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from hybridkv.connectors.file_format import CORRUPT, MISSING, PartError
from hybridkv.connectors.offloading.policies import create_policy
from hybridkv.connectors.offloading.tier import TierIndex, UnitState
from hybridkv.kv.hashing import BlockHash


def checksum(data: torch.Tensor) -> int:
    array: Any = data.contiguous().numpy()
    return int(xxhash.xxh3_64_intdigest(memoryview(array)))


@dataclass(frozen=True, slots=True)
class CpuPart:
    data: torch.Tensor
    checksum: int


class CpuTier:
    name = "cpu"

    def __init__(self, capacity: int, eviction: str, unit_bytes: int) -> None:
        self.index = TierIndex("cpu", capacity, create_policy(eviction, capacity // unit_bytes))

    def store(self, unit_hash: BlockHash, parts: dict[int, torch.Tensor]) -> bool:
        """Checksum and commit a reserved unit's parts; False if the reservation is gone."""
        sealed = {gid: CpuPart(data, checksum(data)) for gid, data in parts.items()}
        return self.index.commit(unit_hash, sealed)

    def read(self, unit_hash: BlockHash, group_id: int) -> torch.Tensor:
        """The verified part (no copy; the tier never changes stored bytes). ``PartError``
        if the unit is gone or its bytes do not match their checksum."""
        entry = self.index.get(unit_hash)
        if entry is None or entry.state is not UnitState.READY:
            raise PartError(MISSING, f"cpu unit {unit_hash.hex()}")
        part: Any = entry.parts.get(group_id)
        if not isinstance(part, CpuPart):
            raise PartError(MISSING, f"cpu unit {unit_hash.hex()} group {group_id}")
        if checksum(part.data) != part.checksum:
            raise PartError(CORRUPT, "cpu checksum mismatch")
        return part.data
