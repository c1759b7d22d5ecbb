"""Prometheus metrics of one server, all prefixed ``hybridkv:``, in a per-server registry.

Two sources, each read in one place:

- **Engine state** (running / waiting requests, KV usage, prefix cache, preemptions, connector
  and offload counters) comes only from an ``EngineStats`` (``hybridkv.engine_stats``). The
  engine thread takes one with ``EngineCore.stats()`` after every step and ``publish``-es it (a
  reference swap); at scrape time a collector turns the latest snapshot into metric families.
  Counts in a snapshot are totals since start, so they are exported as counters as they are.
- **Per-request facts** (finish reason, tokens, latencies, cached prompt tokens by source) are
  observed from each ``RequestOutput`` by ``RequestMetrics`` on the engine thread.

Every metric is listed once, in ``METRICS`` (name, type, labels, meaning); docs/architecture.md
mirrors the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client import Histogram as _Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hybridkv.connectors.config import TierName
from hybridkv.connectors.nixl.metrics import nixl_families
from hybridkv.connectors.stats import Direction
from hybridkv.engine_stats import EngineStats, GroupCacheStats, TransferStats
from hybridkv.kv_events.stats import PublisherStats

if TYPE_CHECKING:
    from hybridkv.engine.output import RequestOutput

PREFIX = "hybridkv:"
CACHE_SOURCES = ("local", "cpu", "disk", "remote", "peer")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    kind: str  # gauge | counter | histogram
    labels: tuple[str, ...]
    help: str


# name (without the prefix) -> what it is; the one list of the server's metrics
METRICS: dict[str, MetricSpec] = {
    # engine state, from EngineStats
    "num_requests_running": MetricSpec("gauge", (), "requests in the running batch"),
    "num_requests_waiting": MetricSpec("gauge", (), "requests waiting to be scheduled"),
    "num_requests_waiting_for_remote_kv": MetricSpec(
        "gauge", (), "requests waiting for an asynchronous KV load (also counted as waiting)"
    ),
    "kv_cache_usage_perc": MetricSpec("gauge", (), "fraction of KV blocks in use (1 = 100%)"),
    "num_preemptions": MetricSpec("counter", (), "preemptions (requests sent back to wait)"),
    "prefix_cache_lookups": MetricSpec("counter", (), "prefix-cache lookups"),
    "prefix_cache_hit_tokens": MetricSpec(
        "counter", (), "prompt tokens hit in the prefix cache (valid in every group)"
    ),
    "prefix_cache_queries": MetricSpec(
        "counter", ("group", "kind"), "prompt tokens looked up, per group"
    ),
    "prefix_cache_hits": MetricSpec(
        "counter", ("group", "kind"), "each group's own prefix hits in tokens"
    ),
    "kv_load_failures": MetricSpec("counter", ("reason",), "KV connector load failures, by reason"),
    "recomputed_tokens": MetricSpec("counter", (), "tokens recomputed after failed KV loads"),
    "offload_bytes": MetricSpec(
        "counter", ("tier", "direction"), "bytes moved to or from offload tiers"
    ),
    "offload_seconds": MetricSpec(
        "counter", ("tier", "direction"), "seconds spent moving offloaded KV"
    ),
    "kv_connector_events": MetricSpec("counter", ("name",), "other KV connector counters, by name"),
    "kv_connector_child_events": MetricSpec(
        "counter",
        ("connector", "name"),
        "a MultiConnector child's counters (hits, tokens, bytes, failures...), by child",
    ),
    "kv_events_published_batches": MetricSpec(
        "counter", (), "KV event batches published (--kv-events-config)"
    ),
    "kv_events_dropped_batches": MetricSpec(
        "counter", (), "KV event batches dropped, oldest first, while the publisher fell behind"
    ),
    # per request, from RequestOutputs
    "requests_finished": MetricSpec("counter", ("finish_reason",), "finished requests"),
    "prompt_tokens": MetricSpec("counter", (), "prompt tokens of finished requests"),
    "generation_tokens": MetricSpec("counter", (), "generated tokens"),
    "cached_prompt_tokens": MetricSpec(
        "counter", ("source",), "prompt tokens not computed, by source"
    ),
    "time_to_first_token_seconds": MetricSpec("histogram", (), "arrival to first token"),
    "inter_token_latency_seconds": MetricSpec("histogram", (), "time between output tokens"),
    "e2e_request_latency_seconds": MetricSpec("histogram", (), "arrival to finish"),
    # server limits, from the HTTP layer
    "requests_refused": MetricSpec(
        "counter",
        ("reason",),
        "requests refused before the engine saw them (server limits), by reason",
    ),
}


REFUSAL_REASONS = ("overloaded", "too_large", "body_timeout")


class ServerMetrics:
    """The registry of one server: the snapshot collector plus the per-request metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._snapshot = EngineStats()
        self.registry.register(_SnapshotCollector(lambda: self._snapshot))
        self.requests = RequestMetrics(_create_request_metrics(self.registry))
        spec = METRICS["requests_refused"]
        self._refused = Counter(
            PREFIX + "requests_refused", spec.help, spec.labels, registry=self.registry
        )
        for reason in REFUSAL_REASONS:
            self._refused.labels(reason)  # every reason shows, at zero until used

    def on_refused(self, reason: str) -> None:
        """Count a request refused by a server limit (one of ``REFUSAL_REASONS``)."""
        self._refused.labels(reason).inc()

    def publish(self, snapshot: EngineStats) -> None:
        self._snapshot = snapshot  # one reference swap: scrapes see a whole snapshot

    @property
    def snapshot(self) -> EngineStats:
        return self._snapshot

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _create_request_metrics(registry: CollectorRegistry) -> dict[str, Any]:
    def counter(name: str) -> Counter:
        spec = METRICS[name]
        return Counter(PREFIX + name, spec.help, spec.labels, registry=registry)

    def histogram(name: str) -> _Histogram:
        spec = METRICS[name]
        return _Histogram(PREFIX + name, spec.help, registry=registry, buckets=latency)

    latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    cached = counter("cached_prompt_tokens")
    for source in CACHE_SOURCES:
        cached.labels(source)  # every source shows, at zero until used
    return {
        "finished": counter("requests_finished"),
        "prompt_tokens": counter("prompt_tokens"),
        "generation_tokens": counter("generation_tokens"),
        "cached": cached,
        "ttft": histogram("time_to_first_token_seconds"),
        "itl": histogram("inter_token_latency_seconds"),
        "e2e": histogram("e2e_request_latency_seconds"),
    }


class _SnapshotCollector(Collector):
    def __init__(self, latest: Any) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        s: EngineStats = self._latest()
        yield _family("num_requests_running", s.num_running)
        yield _family("num_requests_waiting", s.num_waiting)
        yield _family("kv_cache_usage_perc", s.kv_usage)
        yield _family("num_preemptions", s.num_preemptions)
        yield _family("prefix_cache_lookups", s.prefix_cache_queries)
        yield _family("prefix_cache_hit_tokens", s.prefix_cache_hit_tokens)
        yield from _group_families(s.groups)
        yield from _transfer_families(s.transfer)
        events = s.transfer.connector.flatten().events if s.transfer.connector else {}
        yield from nixl_families(events, PREFIX)
        yield _family("num_requests_waiting_for_remote_kv", s.num_waiting_for_remote_kv)
        kv_events = s.kv_events or PublisherStats()
        yield _family("kv_events_published_batches", kv_events.published_batches)
        yield _family("kv_events_dropped_batches", kv_events.dropped_batches)


def _family(name: str, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
    spec = METRICS[name]
    labels = list(spec.labels) if value is None else None
    if spec.kind == "gauge":
        return GaugeMetricFamily(PREFIX + name, spec.help, value=value, labels=labels)
    return CounterMetricFamily(PREFIX + name, spec.help, value=value, labels=labels)


def _group_families(groups: tuple[GroupCacheStats, ...]) -> Iterator[Metric]:
    queries, hits = _family("prefix_cache_queries"), _family("prefix_cache_hits")
    for g in groups:
        queries.add_metric([str(g.group_id), g.kind], g.queried_tokens)
        hits.add_metric([str(g.group_id), g.kind], g.hit_tokens)
    yield queries
    yield hits


def _transfer_families(t: TransferStats) -> Iterator[Metric]:
    flat = t.connector.flatten() if t.connector is not None else None
    failures = _family("kv_load_failures")
    # the scheduler's count where it saw the reason, else the connector's
    by_reason = {**(flat.load_failures if flat else {}), **t.load_failures}
    for reason, n in sorted(by_reason.items()):
        failures.add_metric([str(reason)], n)
    yield failures
    yield _family("recomputed_tokens", t.recomputed_tokens)
    nbytes, seconds = _family("offload_bytes"), _family("offload_seconds")
    moved = flat.offload_bytes if flat else {}
    spent = flat.offload_seconds if flat else {}
    keys = {(tier, d) for tier in TierName for d in Direction} | set(moved) | set(spent)
    for tier, direction in sorted(keys):
        labels = [str(tier), str(direction)]
        nbytes.add_metric(labels, moved.get((tier, direction), 0))
        seconds.add_metric(labels, spent.get((tier, direction), 0.0))
    yield nbytes
    yield seconds
    events = _family("kv_connector_events")
    for name, value in sorted((flat.events if flat else {}).items()):
        events.add_metric([name], value)
    yield events
    children = _family("kv_connector_child_events")
    for child, stats in sorted((t.connector.children if t.connector else {}).items()):
        sub = stats.flatten()
        named = dict(sub.events)
        named.update({f"load_failures:{r}": n for r, n in sub.load_failures.items()})
        named.update({f"offload_bytes.{t_}.{d}": n for (t_, d), n in sub.offload_bytes.items()})
        named.update({f"offload_seconds.{t_}.{d}": v for (t_, d), v in sub.offload_seconds.items()})
        for name, value in sorted(named.items()):
            children.add_metric([child, name], value)
    yield children


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
