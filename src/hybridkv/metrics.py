"""Prometheus metrics of one server, all prefixed ``hybridkv:``, in a per-server registry.

Two sources, each read in one place:

- **Engine state** (running / waiting requests, KV usage, prefix cache, preemptions, connector
  and offload counters) comes only from an ``EngineStatsSnapshot``. The engine thread takes one
  with ``take_snapshot(engine)`` after every step and ``publish``-es it (a reference swap); at
  scrape time a collector turns the latest snapshot into metric families. Counts in a snapshot
  are totals since start, so they are exported as counters as they are.
- **Per-request facts** (finish reason, tokens, latencies, cached prompt tokens by source) are
  observed from each ``RequestOutput`` by ``RequestMetrics`` on the engine thread.

Connector and offload metrics come from the scheduler's KV transfer stats (load failures,
recomputed tokens) and from the connectors' counter totals by name (``KVTransferStats.
from_counters``); without a connector every such metric reads zero.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client import Histogram as _Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hybridkv.connectors.nixl.metrics import nixl_families

if TYPE_CHECKING:
    from hybridkv.engine.core import EngineCore
    from hybridkv.engine.output import RequestOutput

PREFIX = "hybridkv:"
CACHE_SOURCES = ("local", "cpu", "disk", "remote", "peer")
OFFLOAD_TIERS = ("cpu", "disk", "remote")
OFFLOAD_DIRECTIONS = ("store", "load")


@dataclass(frozen=True, slots=True)
class KVTransferStats:
    """Totals since start kept by the KV connectors; all zero without a connector."""

    load_failures: Mapping[str, int] = field(default_factory=dict)  # by reason
    recomputed_tokens: int = 0  # tokens recomputed after failed or invalid loads
    offload_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (tier, dir)
    offload_seconds: Mapping[tuple[str, str], float] = field(default_factory=dict)
    other: Mapping[str, float] = field(default_factory=dict)  # counters without a metric

    @classmethod
    def from_counters(cls, counters: Mapping[str, float]) -> KVTransferStats:
        """From connector counter totals named ``load_failures.<reason>``,
        ``recomputed_tokens``, ``offload_bytes.<tier>.<store|load>`` and
        ``offload_seconds.<tier>.<store|load>``; any other name lands in ``other``."""
        failures: dict[str, int] = {}
        nbytes: dict[tuple[str, str], int] = {}
        seconds: dict[tuple[str, str], float] = {}
        other: dict[str, float] = {}
        recomputed = 0
        for name, value in counters.items():
            if name.startswith("load_failures:"):  # connectors write load_failures:<reason>
                name = "load_failures." + name.removeprefix("load_failures:")
            head, _, rest = name.partition(".")
            tier, _, direction = rest.partition(".")
            if head == "load_failures" and rest:
                failures[rest] = int(value)
            elif head == "recomputed_tokens" and not rest:
                recomputed = int(value)
            elif head in ("offload_bytes", "offload_seconds") and direction in OFFLOAD_DIRECTIONS:
                if head == "offload_bytes":
                    nbytes[(tier, direction)] = int(value)
                else:
                    seconds[(tier, direction)] = float(value)
            else:
                other[name] = value
        return cls(failures, recomputed, nbytes, seconds, other)


@dataclass(frozen=True, slots=True)
class GroupCacheStats:
    group_id: int
    kind: str  # full_attention | sliding_window | state
    queried_tokens: int
    hit_tokens: int  # this group's own longest hits, summed


@dataclass(frozen=True, slots=True)
class EngineStatsSnapshot:
    """Everything /metrics says about the engine's state, taken on the engine thread."""

    num_running: int = 0
    num_waiting: int = 0
    num_waiting_for_remote_kv: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # lookups (one per admitted request)
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0  # usable hits: valid in every group
    groups: tuple[GroupCacheStats, ...] = ()
    transfer: KVTransferStats = field(default_factory=KVTransferStats)


def take_snapshot(engine: EngineCore) -> EngineStatsSnapshot:
    """Read the engine's stats. NOTE: call on the engine thread only."""
    sched = engine.scheduler.stats()
    cache = engine.kv.stats
    groups = tuple(
        GroupCacheStats(g.group_id, g.kind.value, cache.queried_tokens, hits)
        for g, hits in zip(engine.layout.groups, cache.group_hit_tokens, strict=False)
    )
    transfer = _transfer_stats(engine)
    return EngineStatsSnapshot(
        num_running=sched.num_running,
        num_waiting=sched.num_waiting,
        num_waiting_for_remote_kv=sched.num_waiting_for_remote_kv,
        kv_usage=float(sched.kv_usage),
        num_preemptions=sched.num_preemptions,
        prefix_cache_queries=cache.num_queries,
        prefix_cache_queried_tokens=cache.queried_tokens,
        prefix_cache_hit_tokens=cache.hit_tokens,
        groups=groups,
        transfer=transfer,
    )


def _transfer_stats(engine: EngineCore) -> KVTransferStats:
    """Load failures and recomputed tokens from the scheduler's KV transfer (when a connector
    is configured); offload bytes and seconds from ``engine.connector_counters`` (totals by
    name, see ``KVTransferStats.from_counters``) once the engine keeps them."""
    counters = getattr(engine, "connector_counters", None) or {}
    stats = KVTransferStats.from_counters(counters)
    transfer = getattr(engine.scheduler, "transfer", None)
    if transfer is None:
        return stats
    return replace(
        stats,
        load_failures={**stats.load_failures, **transfer.stats.load_failures},
        recomputed_tokens=stats.recomputed_tokens + transfer.stats.recomputed_tokens,
    )


class ServerMetrics:
    """The registry of one server: the snapshot collector plus the per-request metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._snapshot = EngineStatsSnapshot()
        self.registry.register(_SnapshotCollector(lambda: self._snapshot))
        self.requests = RequestMetrics(_create_request_metrics(self.registry))

    def publish(self, snapshot: EngineStatsSnapshot) -> None:
        self._snapshot = snapshot  # one reference swap: scrapes see a whole snapshot

    @property
    def snapshot(self) -> EngineStatsSnapshot:
        return self._snapshot

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _create_request_metrics(registry: CollectorRegistry) -> dict[str, Any]:
    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(PREFIX + name, doc, labels, registry=registry)

    def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> _Histogram:
        return _Histogram(PREFIX + name, doc, registry=registry, buckets=buckets)

    latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    cached = counter("cached_prompt_tokens", "prompt tokens not computed, by source", ("source",))
    for source in CACHE_SOURCES:
        cached.labels(source)  # every source shows, at zero until used
    return {
        "finished": counter("requests_finished", "finished requests", ("finish_reason",)),
        "prompt_tokens": counter("prompt_tokens", "prompt tokens of finished requests"),
        "generation_tokens": counter("generation_tokens", "generated tokens"),
        "cached": cached,
        "ttft": histogram("time_to_first_token_seconds", "arrival to first token", latency),
        "itl": histogram("inter_token_latency_seconds", "time between output tokens", latency),
        "e2e": histogram("e2e_request_latency_seconds", "arrival to finish", latency),
    }


class _SnapshotCollector(Collector):
    def __init__(self, latest: Any) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        s: EngineStatsSnapshot = self._latest()
        yield _gauge("num_requests_running", "requests in the running batch", s.num_running)
        yield _gauge("num_requests_waiting", "requests waiting to be scheduled", s.num_waiting)
        yield _gauge("kv_cache_usage_perc", "fraction of KV blocks in use (1 = 100%)", s.kv_usage)
        yield _counter(
            "num_preemptions", "preemptions (requests sent back to wait)", s.num_preemptions
        )
        yield _counter("prefix_cache_lookups", "prefix-cache lookups", s.prefix_cache_queries)
        yield _counter(
            "prefix_cache_hit_tokens",
            "prompt tokens hit in the prefix cache (valid in every group)",
            s.prefix_cache_hit_tokens,
        )
        yield from _group_families(s.groups)
        yield from _transfer_families(s.transfer)
        yield from nixl_families(s.transfer.other, PREFIX)
        yield _gauge(
            "num_requests_waiting_for_remote_kv",
            "requests waiting for an asynchronous KV load (also counted as waiting)",
            s.num_waiting_for_remote_kv,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _labelled(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=labels)


def _group_families(groups: tuple[GroupCacheStats, ...]) -> Iterator[Metric]:
    queries = _labelled(
        "prefix_cache_queries", "prompt tokens looked up, per group", ["group", "kind"]
    )
    hits = _labelled(
        "prefix_cache_hits", "each group's own prefix hits in tokens", ["group", "kind"]
    )
    for g in groups:
        queries.add_metric([str(g.group_id), g.kind], g.queried_tokens)
        hits.add_metric([str(g.group_id), g.kind], g.hit_tokens)
    yield queries
    yield hits


def _transfer_families(t: KVTransferStats) -> Iterator[Metric]:
    failures = _labelled("kv_load_failures", "KV connector load failures, by reason", ["reason"])
    for reason, n in sorted(t.load_failures.items()):
        failures.add_metric([reason], n)
    yield failures
    yield _counter(
        "recomputed_tokens", "tokens recomputed after failed KV loads", t.recomputed_tokens
    )
    nbytes = _labelled(
        "offload_bytes", "bytes moved to or from offload tiers", ["tier", "direction"]
    )
    seconds = _labelled(
        "offload_seconds", "seconds spent moving offloaded KV", ["tier", "direction"]
    )
    keys = {(tier, d) for tier in OFFLOAD_TIERS for d in OFFLOAD_DIRECTIONS}
    keys |= set(t.offload_bytes) | set(t.offload_seconds)
    for tier, direction in sorted(keys):
        nbytes.add_metric([tier, direction], t.offload_bytes.get((tier, direction), 0))
        seconds.add_metric([tier, direction], t.offload_seconds.get((tier, direction), 0.0))
    yield nbytes
    yield seconds
    events = _labelled("kv_connector_events", "other KV connector counters, by name", ["name"])
    for name, value in sorted(t.other.items()):
        events.add_metric([name], value)
    yield events


@dataclass(slots=True)
class _Timing:
    arrival: float
    last_token_time: float | None = None
    num_tokens: int = 0


class RequestMetrics:
    """Latency, token and finish-reason metrics from each request's outputs.

    NOTE: called on the engine thread only (prometheus_client's metrics are thread-safe, the
    timing table is not)."""

    def __init__(self, metrics: dict[str, Any]) -> None:
        self._m = metrics
        self._timings: dict[str, _Timing] = {}

    def on_arrival(self, request_id: str, arrival: float) -> None:
        self._timings[request_id] = _Timing(arrival)

    def forget(self, request_id: str) -> None:
        """A request rejected before it ran: it finished nothing."""
        self._timings.pop(request_id, None)

    def on_output(self, out: RequestOutput, now: float) -> None:
        t = self._timings.get(out.request_id)
        if t is None:
            return
        num_new = len(out.token_ids) - t.num_tokens
        if num_new > 0:
            if t.last_token_time is None:
                self._m["ttft"].observe(now - t.arrival)
            else:
                for _ in range(num_new):
                    self._m["itl"].observe((now - t.last_token_time) / num_new)
            t.last_token_time, t.num_tokens = now, len(out.token_ids)
        if out.finished:
            self._on_finished(out, now - t.arrival)
            del self._timings[out.request_id]

    def _on_finished(self, out: RequestOutput, e2e_s: float) -> None:
        self._m["e2e"].observe(e2e_s)
        self._m["finished"].labels(out.finish_reason or "unknown").inc()
        self._m["prompt_tokens"].inc(out.num_prompt_tokens)
        self._m["generation_tokens"].inc(len(out.token_ids))
        for source, n in out.cached_tokens.items():
            if n:
                self._m["cached"].labels(source).inc(n)
