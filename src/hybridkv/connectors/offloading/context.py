"""What the two halves of one process's ``OffloadingConnector`` share."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.units import UnitGeometry


@dataclass(frozen=True, slots=True)
class OffloadContext:
    """The validated options, the unit geometry, and the configured tiers (fastest first)."""

    config: OffloadingConfig
    geometry: UnitGeometry
    stack: TierStack
