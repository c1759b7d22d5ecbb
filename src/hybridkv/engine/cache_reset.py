"""``reset_prefix_cache``: forget every cached block (and, on request, every tier unit).

Like vLLM's, a reset only runs while the engine is idle: with a request running or waiting,
or blocks still held for a save in flight, it is refused (``ok=False`` with the reason) and
nothing changes -- clearing the map under a running request would leave its blocks keyed
nowhere while it still writes them, and dropping only the unreferenced ones would not be the
empty cache a caller asks for. ``tiers=True`` also drops the connector's tier units that no
load has pinned and no store is writing; a connector without tiers makes that an error
(``NoTiersError``) before anything is reset. Subscribers of KV events get ``AllBlocksCleared``
followed by the tier units still held.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.tier_events import NoTiersError
from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.sched.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class ResetResult:
    ok: bool
    reason: str = ""  # why a reset was refused
    num_tier_units: int = 0  # tier units dropped (tiers=True)


def reset_prefix_cache(
    kv: KVCacheCoordinator,
    scheduler: Scheduler,
    connector: KVConnectorPair | None,
    events: KVEventCollector | None,
    tiers: bool,
) -> ResetResult:
    if tiers and connector is None:
        raise NoTiersError("no KV connector is configured: there are no tiers to reset")
    if scheduler.has_unfinished_requests():
        n = len(scheduler.requests)
        return ResetResult(False, f"{n} requests are running or waiting; retry when idle")
    if not kv.is_idle():
        return ResetResult(False, "KV blocks are still held (a save in flight); retry shortly")
    if events is not None:
        events.publish_step(kv.take_events())  # what happened before the reset
    num_units = 0
    if connector is not None and tiers:
        caps = connector.scheduler.capabilities()
        num_units = caps.require_tiers(type(connector.scheduler).__name__).reset_tiers()
    cleared = kv.reset_prefix_cache()
    assert cleared, "an idle coordinator always resets"
    if events is not None:
        kv.take_events()  # the pools' CLEARED: said once below
        found = connector.scheduler.capabilities().tiers if connector is not None else None
        resident = found.resident_units if found is not None else list
        events.publish_reset(resident)
    return ResetResult(True, num_tier_units=num_units)
