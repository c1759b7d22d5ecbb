"""What a connector with storage tiers tells KV-event publishers: units stored and dropped.

A tier unit ends at token T and is keyed by the block hash at T (``offloading/units.py``); it
holds every group's part at once. ``TierEvent`` is plain data so the publisher (``hybridkv.
kv_events``) needs nothing of the connector; tiers call the sink from whichever thread changed
their index (the scheduler's, or a worker's), so a sink must be thread-safe and never block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hybridkv.kv.hashing import BlockHash


@dataclass(frozen=True, slots=True)
class TierEvent:
    """Unit ``unit_hash`` (the ``num_tokens`` tokens ending at token ``end``, after unit
    ``parent``) became READY in ``tier`` (``stored``) or left it."""

    stored: bool
    tier: str
    unit_hash: BlockHash
    end: int
    parent: BlockHash | None
    num_tokens: int


TierEventSink = Callable[[TierEvent], None]


class NoTiersError(ValueError):
    """The configured connector keeps no storage tiers (a reset of tiers asked of it)."""
