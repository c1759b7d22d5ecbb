"""The cpu tier's registry entry: its options (``cpu_bytes``, ``cpu_prealloc``) and factory.

Torch-free to import (the factory imports the tier). Tests swap ``load_pagecopy`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hybridkv.connectors.config import OptionsContext, TierName
from hybridkv.connectors.offloading.config import check_memory, flag, size_value
from hybridkv.connectors.offloading.tier_registry import TierBuild, TierEntry, TierOptions
from hybridkv.native import load_pagecopy

if TYPE_CHECKING:
    from hybridkv.connectors.offloading.tier_base import Tier


@dataclass(frozen=True, slots=True)
class CpuOptions(TierOptions):
    KEYS: ClassVar[tuple[str, ...]] = ("cpu_bytes", "cpu_prealloc")
    cpu_bytes: int
    cpu_prealloc: bool = False

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> CpuOptions | None:
        prealloc = flag(extra, "cpu_prealloc", False)
        if "cpu_bytes" not in extra:
            return None
        options = cls(size_value(extra, "cpu_bytes"), prealloc)
        check_memory(options.cpu_bytes, prealloc)
        return options


def _create_cpu(options: CpuOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.tiers.cpu.tier import CpuTier

    geometry = build.geometry
    cpu = CpuTier(
        options.cpu_bytes, build.shared.eviction, build.unit_bytes, load_pagecopy(), geometry
    )
    if options.cpu_prealloc:
        cpu.preallocate(geometry.steady_part_sizes())
    return cpu


ENTRY: TierEntry[Any] = TierEntry(TierName.CPU, "CPU", CpuOptions, _create_cpu, order=10)
