"""``create_offloading_connector``: the tiers, shared by the two halves of one process."""

from __future__ import annotations

from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.offloading.config import OffloadingConfig, check_sizes
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.cpu_tier import CpuTier
from hybridkv.connectors.offloading.disk_tier import DiskTier
from hybridkv.connectors.offloading.remote_tier import RemoteTier
from hybridkv.connectors.offloading.scheduler import OffloadingScheduler
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.connectors.offloading.worker import OffloadingWorker
from hybridkv.connectors.registry import ConnectorContext
from hybridkv.native import load_pagecopy


def create_offloading_connector(
    config: KVTransferConfig, context: ConnectorContext
) -> KVConnectorPair:
    layout = context.layout
    options = config.options_as(OffloadingConfig)
    geometry = UnitGeometry(layout, options.chunk_tokens)
    unit_bytes = max(1, geometry.unit_nbytes(options.chunk_tokens * 2))
    check_sizes(options, unit_bytes, context.max_model_len)
    tiers = _create_tiers(options, geometry, unit_bytes, context.fingerprint)
    ctx = OffloadContext(options, geometry, TierStack(tiers))
    scheduler = OffloadingScheduler(
        ctx, load=config.kv_role != "kv_producer", save=config.kv_role != "kv_consumer"
    )
    return KVConnectorPair(scheduler, OffloadingWorker(ctx))


def _create_tiers(
    options: OffloadingConfig, geometry: UnitGeometry, unit_bytes: int, fingerprint: str
) -> list[Tier]:
    """The configured tiers, fastest first; if one cannot be created, those created before
    it are shut down (their threads joined) before the error propagates."""
    tiers: list[Tier] = []
    try:
        for create in (_cpu_tier, _disk_tier, _remote_tier):
            tier = create(options, geometry, unit_bytes, fingerprint)
            if tier is not None:
                tiers.append(tier)
    except BaseException:
        for created in tiers:
            created.shutdown()
        raise
    return tiers


def _cpu_tier(
    options: OffloadingConfig, geometry: UnitGeometry, unit_bytes: int, fingerprint: str
) -> CpuTier | None:
    cpu = None
    if options.cpu_bytes is not None:
        cpu = CpuTier(options.cpu_bytes, options.eviction, unit_bytes, load_pagecopy(), geometry)
        if options.cpu_prealloc:
            cpu.preallocate(geometry.steady_part_sizes())
    return cpu


def _disk_tier(
    options: OffloadingConfig, geometry: UnitGeometry, unit_bytes: int, fingerprint: str
) -> DiskTier | None:
    disk = None
    if options.disk_path is not None and options.disk_bytes is not None:
        try:
            disk = DiskTier(
                options.disk_path,
                fingerprint,
                options.disk_bytes,
                options.eviction,
                geometry,
                io_timeout=options.load_timeout_seconds,
            )
        except OSError as exc:  # a file, no permission...: a config error, said at start-up
            raise ValueError(
                f"OffloadingConnector: cannot use 'disk_path'={options.disk_path!r} as a KV "
                f"directory: {exc.strerror or exc}"
            ) from None
    return disk


def _remote_tier(
    options: OffloadingConfig, geometry: UnitGeometry, unit_bytes: int, fingerprint: str
) -> RemoteTier | None:
    remote = None
    if options.remote_url is not None:
        remote = RemoteTier(options, fingerprint, geometry)
    return remote
