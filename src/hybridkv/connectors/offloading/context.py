"""What the two halves of one process's ``OffloadingConnector`` share."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.cpu_tier import CpuTier
from hybridkv.connectors.offloading.disk_tier import DiskTier
from hybridkv.connectors.offloading.units import UnitGeometry


@dataclass(frozen=True, slots=True)
class OffloadContext:
    """The validated options, the unit geometry, and the tiers (None: not configured)."""

    config: OffloadingConfig
    geometry: UnitGeometry
    cpu: CpuTier | None
    disk: DiskTier | None
