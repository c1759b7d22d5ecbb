"""``EngineStats``: one typed snapshot of the engine's state and counters.

``EngineCore.stats()`` takes it on the engine thread; ``/metrics`` (``metrics.py``), the
server's periodic log line (``stats_line``) and the tests read it, and nothing else reaches
into the engine for numbers. Counts are totals since start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hybridkv.connectors.stats import ConnectorStats
from hybridkv.kv_events.stats import PublisherStats
from hybridkv.step_io import FailureReason


@dataclass(frozen=True, slots=True)
class GroupCacheStats:
    group_id: int
    kind: str  # full_attention | sliding_window | state
    queried_tokens: int
    hit_tokens: int  # this group's own longest hits, summed


@dataclass(frozen=True, slots=True)
class TransferStats:
    """KV transfer totals; all zero without a connector."""

    load_failures: Mapping[FailureReason, int] = field(default_factory=dict)  # scheduler's view
    recomputed_tokens: int = 0  # tokens recomputed after failed or invalid loads
    failed_requests: int = 0  # requests that recovered from (or failed on) a bad load
    external_tokens: int = 0  # prompt tokens admitted as external hits
    connector: ConnectorStats | None = None  # the connector's own totals (tiers, children)


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_for_remote_kv: int = 0  # included in num_waiting
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # lookups (one per admitted request)
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0  # usable hits: valid in every group
    groups: tuple[GroupCacheStats, ...] = ()
    transfer: TransferStats = field(default_factory=TransferStats)
    kv_events: PublisherStats | None = None  # KV event batches published / dropped (if on)


def stats_line(s: EngineStats) -> str:
    """The periodic log line."""
    hit = (
        s.prefix_cache_hit_tokens / s.prefix_cache_queried_tokens
        if s.prefix_cache_queried_tokens
        else 0.0
    )
    line = (
        f"running: {s.num_running} reqs, waiting: {s.num_waiting} reqs, "
        f"KV cache usage: {s.kv_usage:.1%}, prefix cache hit rate: {hit:.1%}, "
        f"preemptions: {s.num_preemptions}"
    )
    t = s.transfer
    if t.connector is not None:
        failures = sum(t.load_failures.values())
        line += f", external tokens: {t.external_tokens}, load failures: {failures}"
    return line
