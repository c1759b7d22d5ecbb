"""The built-in tiers' registry entries: cpu, disk, remote (``tier_registry`` loads them).

Each tier's options use today's flat keys as field names, so ``OffloadingConfig`` keeps them as
its own flat fields too. The factories import the tiers (torch, native kernels, valkey) when
called: importing this module stays torch-free. Tests swap ``load_pagecopy`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hybridkv.connectors.config import OptionsContext, TierName
from hybridkv.connectors.offloading.config import (
    OffloadingConfig,
    check_memory,
    err,
    flag,
    path_value,
    remote_values,
    size_value,
)
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


@dataclass(frozen=True, slots=True)
class RemoteOptions(TierOptions):
    KEYS: ClassVar[tuple[str, ...]] = (
        "remote_url",
        "remote_timeout_seconds",
        "remote_key_prefix",
        "remote_ttl_seconds",
        "remote_auth_key_file",
        "remote_username",
        "remote_password_file",
        "remote_tls_ca_file",
        "remote_tls_cert_file",
        "remote_tls_key_file",
    )
    remote_url: str
    remote_timeout_seconds: float = 2.0
    remote_key_prefix: str = "hybridkv:"
    remote_ttl_seconds: int | None = None
    remote_auth_key_file: str | None = None
    remote_username: str | None = None
    remote_password_file: str | None = None
    remote_tls_ca_file: str | None = None
    remote_tls_cert_file: str | None = None
    remote_tls_key_file: str | None = None

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> RemoteOptions | None:
        values = remote_values(extra)  # every key checked, also without remote_url
        return None if "remote_url" not in values else cls(**values)


def _create_cpu(options: CpuOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.cpu_tier import CpuTier

    geometry = build.geometry
    cpu = CpuTier(
        options.cpu_bytes, build.shared.eviction, build.unit_bytes, load_pagecopy(), geometry
    )
    if options.cpu_prealloc:
        cpu.preallocate(geometry.steady_part_sizes())
    return cpu


def _create_disk(options: DiskOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.disk_tier import DiskTier

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


def _create_remote(options: RemoteOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.remote_tier import RemoteTier

    # the remote tier reads the flat ``remote_*`` fields, which parse copied from ``options``
    assert isinstance(build.shared, OffloadingConfig)
    return RemoteTier(build.shared, build.fingerprint, build.geometry)


BUILTIN_TIERS: tuple[TierEntry[Any], ...] = (
    TierEntry(TierName.CPU, "CPU", CpuOptions, _create_cpu, order=10),
    TierEntry(TierName.DISK, "DISK", DiskOptions, _create_disk, order=20),
    TierEntry(TierName.REMOTE, "REMOTE", RemoteOptions, _create_remote, order=30),
)
