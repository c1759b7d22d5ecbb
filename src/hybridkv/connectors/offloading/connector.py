"""``create_offloading_connector``: the tiers, shared by the two halves of one process."""

from __future__ import annotations

from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.offloading.config import OffloadingConfig, check_sizes
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.scheduler import OffloadingScheduler
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.tier_registry import TierBuild, tier_entries
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.connectors.offloading.worker import OffloadingWorker
from hybridkv.connectors.registry import ConnectorContext


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
    """The configured tiers, fastest first (``tier_registry`` order); if one cannot be
    created, those created before it are shut down (their threads joined) before the error
    propagates."""
    build = TierBuild(options, geometry, unit_bytes, fingerprint)
    tiers: list[Tier] = []
    try:
        for entry in tier_entries():
            own = options.tiers.get(entry.name)
            if own is not None:
                tiers.append(entry.create(own, build))
    except BaseException:
        for created in tiers:
            created.shutdown()
        raise
    return tiers
