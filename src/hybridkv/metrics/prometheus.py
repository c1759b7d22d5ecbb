"""Prometheus metrics of one server, all prefixed ``hybridkv:``, in a per-server registry.

Two sources, each read in one place:

- **Engine state** (running / waiting requests, KV usage, prefix cache, preemptions, connector
  and offload counters) comes only from an ``EngineStats`` (``hybridkv.engine.stats``). The
  engine thread takes one with ``EngineCore.stats()`` after every step and ``publish``-es it (a
  reference swap); at scrape time a collector turns the latest snapshot into metric families.
  Counts in a snapshot are totals since start, so they are exported as counters as they are.
- **Per-request facts** (finish reason, tokens, latencies, cached prompt tokens by source) are
  observed from each ``RequestOutput`` by ``RequestMetrics`` on the engine thread.

Every metric is listed once, in ``METRICS`` (name, type, labels, meaning); docs/architecture.md
mirrors the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hybridkv.connectors.config import TierName
from hybridkv.connectors.nixl.metrics import nixl_families
from hybridkv.connectors.stats import Direction
from hybridkv.engine.stats import EngineStats, GroupCacheStats, TransferStats
from hybridkv.kv_events.stats import PublisherStats
from hybridkv.metrics.checkpoints import checkpoint_families
from hybridkv.metrics.requests import ITERATION_BUCKETS, RequestMetrics, create_request_metrics

if TYPE_CHECKING:
    pass

PREFIX = "hybridkv:"
MODEL_LABEL = "model_name"  # on every sample (vLLM's)
CACHE_INFO_LABELS = (
    "block_size",
    "num_blocks",
    "num_state_slots",
    "num_layout_groups",
    "enable_prefix_caching",
    "cache_dtype",
    "kv_cache_memory",
)


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
    "state_checkpoints_admitted": MetricSpec(
        "counter", ("kind",), "state checkpoints kept, by kind"
    ),
    "state_checkpoints_refused": MetricSpec(
        "counter", ("kind",), "due state checkpoints not kept (worth less than the budget's)"
    ),
    "state_checkpoints_evicted": MetricSpec("counter", ("reason",), "state checkpoints evicted"),
    "state_checkpoint_hits": MetricSpec("counter", ("kind",), "state checkpoints restored"),
    "state_checkpoint_bytes": MetricSpec("gauge", (), "bytes the state checkpoints hold"),
    "state_checkpoint_budget_bytes": MetricSpec(
        "gauge", (), "bytes state_checkpoint_budget allows (0: no state layers)"
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
    "iteration_tokens_total": MetricSpec(
        "histogram", (), "tokens computed per engine step (prompt + generated)"
    ),
    "cache_config_info": MetricSpec("gauge", CACHE_INFO_LABELS, "the KV cache's configuration"),
    # server limits, from the HTTP layer
    "requests_refused": MetricSpec(
        "counter",
        ("reason",),
        "requests refused before the engine saw them (server limits), by reason",
    ),
    "stalled_clients_disconnected": MetricSpec(
        "counter",
        (),
        "connections closed because the client read none of its response for "
        "--stream-stall-seconds (its request aborted)",
    ),
}


# per request, from RequestOutputs (requests.py)
REQUEST_METRICS: dict[str, MetricSpec] = {
    "requests_finished": MetricSpec("counter", ("finish_reason",), "finished requests"),
    "prompt_tokens": MetricSpec("counter", (), "prompt tokens of finished requests"),
    "generation_tokens": MetricSpec("counter", (), "generated tokens"),
    "cached_prompt_tokens": MetricSpec(
        "counter", ("source",), "prompt tokens not computed, by source"
    ),
    "time_to_first_token_seconds": MetricSpec("histogram", (), "arrival to first token"),
    "inter_token_latency_seconds": MetricSpec("histogram", (), "time between output tokens"),
    "e2e_request_latency_seconds": MetricSpec("histogram", (), "arrival to finish"),
    "request_queue_time_seconds": MetricSpec(
        "histogram", (), "arrival in the engine to first scheduled"
    ),
    "request_prefill_time_seconds": MetricSpec("histogram", (), "first scheduled to first token"),
    "request_decode_time_seconds": MetricSpec("histogram", (), "first token to last token"),
    "request_prompt_tokens": MetricSpec("histogram", (), "prompt length of finished requests"),
    "request_generation_tokens": MetricSpec(
        "histogram", (), "tokens generated by finished requests (all n choices)"
    ),
}
METRICS.update(REQUEST_METRICS)

REFUSAL_REASONS = ("overloaded", "too_large", "body_timeout")


class ServerMetrics:
    """The registry of one server: the snapshot collector plus the per-request metrics. Every
    sample carries ``model_name`` (the served name); ``cache_info`` fills
    ``cache_config_info``'s labels."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self, model_name: str = "", cache_info: Mapping[str, object] | None = None
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._snapshot = EngineStats()
        info = {k: str((cache_info or {}).get(k, "")) for k in CACHE_INFO_LABELS}
        self.registry.register(_SnapshotCollector(lambda: self._snapshot, info))
        made = create_request_metrics(self.registry, REQUEST_METRICS, PREFIX)
        self.requests = RequestMetrics(made)
        spec = METRICS["iteration_tokens_total"]
        self._iteration = Histogram(PREFIX + "iteration_tokens_total", spec.help,
                                    registry=self.registry, buckets=ITERATION_BUCKETS)  # fmt: skip
        spec = METRICS["requests_refused"]
        self._refused = Counter(
            PREFIX + "requests_refused", spec.help, spec.labels, registry=self.registry
        )
        for reason in REFUSAL_REASONS:
            self._refused.labels(reason)  # every reason shows, at zero until used
        spec = METRICS["stalled_clients_disconnected"]
        self._stalled = Counter(
            PREFIX + "stalled_clients_disconnected", spec.help, registry=self.registry
        )

    def on_refused(self, reason: str) -> None:
        """Count a request refused by a server limit (one of ``REFUSAL_REASONS``)."""
        self._refused.labels(reason).inc()

    def on_stalled(self) -> None:
        """Count a connection closed because its client stopped reading (event loop only)."""
        self._stalled.inc()

    def publish(self, snapshot: EngineStats) -> None:
        """The engine thread's newest snapshot (after each iteration: one step at most)."""
        if snapshot.steps.num_steps > self._snapshot.steps.num_steps:
            self._iteration.observe(snapshot.steps.last_step_tokens)
        self._snapshot = snapshot  # one reference swap: scrapes see a whole snapshot

    @property
    def snapshot(self) -> EngineStats:
        return self._snapshot

    def render(self) -> bytes:
        return generate_latest(_WithModelName(self.registry, self.model_name))


class _WithModelName:
    """The registry's families with ``model_name`` added to every sample."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self._registry = registry
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                s._replace(labels={MODEL_LABEL: self._model_name, **s.labels})
                for s in family.samples
            ]
            yield labelled


class _SnapshotCollector(Collector):
    def __init__(self, latest: Any, cache_info: dict[str, str]) -> None:
        self._latest = latest
        self._info = _family("cache_config_info")
        self._info.add_metric([cache_info[k] for k in CACHE_INFO_LABELS], 1.0)

    def collect(self) -> Iterator[Metric]:
        s: EngineStats = self._latest()
        yield self._info
        yield _family("num_requests_running", s.num_running)
        yield _family("num_requests_waiting", s.num_waiting)
        yield _family("kv_cache_usage_perc", s.kv_usage)
        yield _family("num_preemptions", s.num_preemptions)
        yield _family("prefix_cache_lookups", s.prefix_cache_queries)
        yield _family("prefix_cache_hit_tokens", s.prefix_cache_hit_tokens)
        yield from _group_families(s.groups)
        yield from checkpoint_families(s.checkpoints, _family)
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
