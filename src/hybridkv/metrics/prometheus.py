"""Prometheus metrics of one server in a per-server registry: vLLM's families under ``vllm:``
(vLLM's names and meanings), hybridkv's richer ones under ``hybridkv:`` (``table.py``).

Two sources, each read in one place:

- **Engine state** (running / waiting requests, KV usage, prefix cache, preemptions, connector
  and offload counters) comes only from an ``EngineStats`` (``hybridkv.engine.stats``). The
  engine thread takes one with ``EngineCore.stats()`` after every step and ``publish``-es it (a
  reference swap); at scrape time a collector turns the latest snapshot into metric families.
  Counts in a snapshot are totals since start, so they are exported as counters as they are.
- **Per-request facts** (finish reason, tokens, latencies, cached prompt tokens by source) are
  observed from each ``RequestOutput`` by ``RequestMetrics`` on the engine thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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
from hybridkv.metrics.table import (
    CACHE_INFO_LABELS,
    HYBRIDKV,
    METRICS,
    MODEL_LABEL,
    REQUEST_METRICS,
    VLLM_CACHE_INFO_LABELS,
)

__all__ = ["METRICS", "ServerMetrics"]
PREFIX = HYBRIDKV  # the NixlConnector's kv_transfer_* families
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
        self.registry.register(_SnapshotCollector(lambda: self._snapshot, cache_info or {}))
        self.requests = RequestMetrics(create_request_metrics(self.registry, REQUEST_METRICS))
        name = "vllm:iteration_tokens_total"
        self._iteration = Histogram(name, METRICS[name].help, registry=self.registry,
                                    buckets=ITERATION_BUCKETS)  # fmt: skip
        name = "hybridkv:requests_refused"
        spec = METRICS[name]
        self._refused = Counter(name, spec.help, spec.labels, registry=self.registry)
        for reason in REFUSAL_REASONS:
            self._refused.labels(reason)  # every reason shows, at zero until used
        name = "hybridkv:stalled_clients_disconnected"
        self._stalled = Counter(name, METRICS[name].help, registry=self.registry)

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
    def __init__(self, latest: Any, cache_info: Mapping[str, object]) -> None:
        self._latest = latest
        self._info = [_info_family("hybridkv:cache_config_info", CACHE_INFO_LABELS, cache_info)]
        self._info.append(_info_family("vllm:cache_config_info", VLLM_CACHE_INFO_LABELS,
                                       vllm_cache_info(cache_info)))  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        s: EngineStats = self._latest()
        yield from self._info
        yield _family("vllm:num_requests_running", s.num_running)
        yield _family("vllm:num_requests_waiting", s.num_waiting)
        yield _family("vllm:kv_cache_usage_perc", s.kv_usage)
        yield _family("vllm:num_preemptions", s.num_preemptions)
        # vLLM's: tokens, over the whole request (a hit is valid in every group)
        yield _family("vllm:prefix_cache_queries", s.prefix_cache_queried_tokens)
        yield _family("vllm:prefix_cache_hits", s.prefix_cache_hit_tokens)
        yield _family("hybridkv:prefix_cache_lookups", s.prefix_cache_queries)
        yield _family("hybridkv:prompt_tokens_computed", s.steps.prompt_tokens)
        yield _family("hybridkv:prompt_compute_seconds", s.steps.prompt_seconds)
        yield _family("hybridkv:inflight_prefix_waits", s.inflight.num_waits)
        yield _family("hybridkv:inflight_prefix_wait_steps", s.inflight.num_wait_steps)
        yield _family("hybridkv:inflight_prefix_waits_expired", s.inflight.num_expired)
        yield _family("hybridkv:inflight_prefix_hit_tokens", s.inflight.hit_tokens_gained)
        yield from _group_families(s.groups)
        yield from checkpoint_families(s.checkpoints, _family)
        yield from _transfer_families(s.transfer)
        events = s.transfer.connector.flatten().events if s.transfer.connector else {}
        yield from nixl_families(events, PREFIX)
        yield _family("hybridkv:num_requests_waiting_for_remote_kv", s.num_waiting_for_remote_kv)
        kv_events = s.kv_events or PublisherStats()
        yield _family("hybridkv:kv_events_published_batches", kv_events.published_batches)
        yield _family("hybridkv:kv_events_dropped_batches", kv_events.dropped_batches)


def vllm_cache_info(info: Mapping[str, object]) -> dict[str, object]:
    """``vllm:cache_config_info``'s labels from ours: vLLM's ``num_gpu_blocks`` is the count of
    KV blocks (on the CPU here); the prefix-match unit is one block (hashes cover whole blocks,
    and a hit may end on any block boundary where every group holds data)."""
    return {
        **info,
        "num_gpu_blocks": info.get("num_blocks", ""),
        "prefix_match_unit": info.get("block_size", ""),
    }


def _info_family(name: str, labels: tuple[str, ...], info: Mapping[str, object]) -> Metric:
    family = _family(name)
    family.add_metric([str(info.get(k, "")) for k in labels], 1.0)
    return family


def _family(name: str, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
    spec = METRICS[name]
    labels = list(spec.labels) if value is None else None
    if spec.kind == "gauge":
        return GaugeMetricFamily(name, spec.help, value=value, labels=labels)
    return CounterMetricFamily(name, spec.help, value=value, labels=labels)


def _group_families(groups: tuple[GroupCacheStats, ...]) -> Iterator[Metric]:
    queries = _family("hybridkv:group_prefix_cache_queries")
    hits = _family("hybridkv:group_prefix_cache_hits")
    for g in groups:
        queries.add_metric([str(g.group_id), g.kind], g.queried_tokens)
        hits.add_metric([str(g.group_id), g.kind], g.hit_tokens)
    yield queries
    yield hits


def _transfer_families(t: TransferStats) -> Iterator[Metric]:
    flat = t.connector.flatten() if t.connector is not None else None
    failures = _family("hybridkv:kv_load_failures")
    # the scheduler's count where it saw the reason, else the connector's
    by_reason = {**(flat.load_failures if flat else {}), **t.load_failures}
    for reason, n in sorted(by_reason.items()):
        failures.add_metric([str(reason)], n)
    yield failures
    yield _family("hybridkv:recomputed_tokens", t.recomputed_tokens)
    nbytes, seconds = _family("hybridkv:offload_bytes"), _family("hybridkv:offload_seconds")
    moved = flat.offload_bytes if flat else {}
    spent = flat.offload_seconds if flat else {}
    keys = {(tier, d) for tier in TierName for d in Direction} | set(moved) | set(spent)
    for tier, direction in sorted(keys):
        labels = [str(tier), str(direction)]
        nbytes.add_metric(labels, moved.get((tier, direction), 0))
        seconds.add_metric(labels, spent.get((tier, direction), 0.0))
    yield nbytes
    yield seconds
    events = _family("hybridkv:kv_connector_events")
    for name, value in sorted((flat.events if flat else {}).items()):
        events.add_metric([name], value)
    yield events
    children = _family("hybridkv:kv_connector_child_events")
    for child, stats in sorted((t.connector.children if t.connector else {}).items()):
        sub = stats.flatten()
        named = dict(sub.events)
        named.update({f"load_failures:{r}": n for r, n in sub.load_failures.items()})
        named.update({f"offload_bytes.{t_}.{d}": n for (t_, d), n in sub.offload_bytes.items()})
        named.update({f"offload_seconds.{t_}.{d}": v for (t_, d), v in sub.offload_seconds.items()})
        for name, value in sorted(named.items()):
            children.add_metric([child, name], value)
    yield children
