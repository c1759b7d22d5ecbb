"""``OffloadingConnector``'s counters (both halves report this type).

Bytes and seconds per tier and direction, and load failures by reason, are the base fields
(``ConnectorStats``); the rest are this connector's own, by tier where they have one."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.choice import Choice
from hybridkv.connectors.stats import ConnectorStats, counter
from hybridkv.step_io import FailureReason


class SkipReason(Choice):
    """Why a unit was not stored."""

    NULL_BLOCK = "null_block"  # a block of the unit already left the sliding window
    NO_ROOM = "no_room"  # no tier could make room (pinned or pending units)
    LOW_VALUE = "low_value"  # every tier with room would evict units worth more (the book's)
    BACKPRESSURE = "backpressure"  # more than max_inflight_io_bytes in flight


@dataclass(slots=True)
class OffloadingStats(ConnectorStats):
    hits: dict[str, int] = counter("hits.{}")  # units a load reads, by the tier serving them
    hit_tokens: dict[str, int] = counter("hit_tokens.{}")
    hits_gone: int = counter("hits.none")  # units no tier held any more when pinned
    hit_tokens_gone: int = counter("hit_tokens.none")
    misses: int = counter("misses")  # admitted requests with nothing to load
    adopted: dict[str, int] = counter("adopted.{}")  # units another process stored
    evictions: dict[str, int] = counter("evictions.{}")
    stores: dict[str, int] = counter("stores.{}")
    stores_skipped: int = counter("stores_skipped")
    stores_skipped_by: dict[SkipReason, int] = counter("stores_skipped:{}")
    # saves a tier skipped for evicting only units worth more (``ValuePolicy``), by tier
    value_skips: dict[str, int] = counter("stores_skipped_low_value.{}")
    store_failures: dict[str, int] = counter("store_failures.{}")
    # units of a slower tier copied into the fastest, by the target tier
    promotions: dict[str, int] = counter("promotions.{}")
    promotion_bytes: dict[str, int] = counter("offload_bytes.{}.promote")
    promotion_seconds: dict[str, float] = counter("offload_seconds.{}.promote")
    promotion_failures: dict[FailureReason, int] = counter("promotion_failures:{}")
    promotions_skipped_no_room: int = counter("promotions_skipped:no_room")
    removed: dict[str, int] = counter("removed.{}")  # bad units dropped on load
    # stored objects a bad unit's discard deleted, by the tier's ``removed_counter`` name
    objects_removed: dict[str, int] = counter("{}")
    # what a tier's own I/O threads counted (stuck or quarantined I/O...), by the tier's names
    tier_counters: dict[str, float] = counter("{}")
    timeouts: int = counter("timeouts")
