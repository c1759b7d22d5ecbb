"""The disk tier's registry entry: its options (``disk_path``, ``disk_bytes``) and factory.

Torch-free to import (the factory imports the tier).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hybridkv.connectors.config import OptionsContext, TierName
from hybridkv.connectors.offloading.config import err, path_value, size_value
from hybridkv.connectors.offloading.tier_registry import TierBuild, TierEntry, TierOptions

if TYPE_CHECKING:
    from hybridkv.connectors.offloading.tier_base import Tier


@dataclass(frozen=True, slots=True)
class DiskOptions(TierOptions):
    KEYS: ClassVar[tuple[str, ...]] = ("disk_path", "disk_bytes")
    disk_path: str
    disk_bytes: int

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> DiskOptions | None:
        size = size_value(extra, "disk_bytes") if "disk_bytes" in extra else None
        if "disk_path" not in extra:
            if size is not None:
                raise ValueError(err("disk_path", "is required with disk_bytes"))
            return None
        path = path_value(extra, "disk_path")
        if size is None:
            raise ValueError(err("disk_bytes", "is required with disk_path"))
        return cls(path, size)


def _create_disk(options: DiskOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.tiers.disk.tier import DiskTier

    try:
        return DiskTier(
            options.disk_path,
            build.fingerprint,
            options.disk_bytes,
            build.shared.eviction,
            build.geometry,
            io_timeout=build.shared.load_timeout_seconds,
        )
    except OSError as exc:  # a file, no permission...: a config error, said at start-up
        raise ValueError(
            f"OffloadingConnector: cannot use 'disk_path'={options.disk_path!r} as a KV "
            f"directory: {exc.strerror or exc}"
        ) from None


ENTRY: TierEntry[Any] = TierEntry(TierName.DISK, "DISK", DiskOptions, _create_disk, order=20)
