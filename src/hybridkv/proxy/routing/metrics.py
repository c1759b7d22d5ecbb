"""The KV routing's Prometheus families on the proxy's ``/metrics`` (``docs/routing.md``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.service import KVRouting

P = "hybridkv_proxy_"


def routing_families(kv: KVRouting) -> Iterator[Metric]:
    decisions = CounterMetricFamily(P + "routing_decisions", "routing decisions", labels=["reason"])
    for reason, n in kv.decisions.items():
        decisions.add_metric([reason.value], n)
    yield decisions
    yield from _settle_families(kv)
    engines = list(kv.engines.values())
    yield from _prediction_families(engines)
    yield from _index_families(engines)
    yield from _event_families(engines)


def _settle_families(kv: KVRouting) -> Iterator[Metric]:
    s = kv.settle_stats
    for name, help_, value in (
        ("settle_waits", "decisions that waited for an index lagging its engine", s.num_waits),
        ("settle_caught_up", "... whose index caught up in time", s.num_caught_up),
        ("settle_wait_seconds", "seconds decisions waited", s.wait_seconds),
        ("settle_forged_seqs", "answers naming events never published (rejected)", s.num_forged),
        (
            "settle_prefill_waits",
            "decisions that waited for a prefill of their prefix",
            s.num_prefill_waits,
        ),
        ("settle_prefill_wait_seconds", "seconds they waited", s.prefill_wait_seconds),
        (
            "settle_prefill_wait_timeouts",
            "prefill waits that ran out (the first-byte timeout)",
            s.num_prefill_wait_timeouts,
        ),
        (
            "settle_prefill_dispatched",
            "decisions sent at once with the landed prefill's hit predicted (attention-only)",
            s.num_prefill_dispatched,
        ),
    ):
        family = CounterMetricFamily(P + name, help_)
        family.add_metric([], value)
        yield family


def _prediction_families(engines: list[EngineState]) -> Iterator[Metric]:
    labels = ["engine"]
    predicted = CounterMetricFamily(
        P + "predicted_cached_tokens",
        "prompt tokens predicted cached, answered requests",
        labels=labels,
    )
    actual = CounterMetricFamily(
        P + "actual_cached_tokens",
        "prompt tokens the engine said were cached (usage)",
        labels=labels,
    )
    results = CounterMetricFamily(
        P + "predictions", "answered requests by prediction result", labels=["engine", "result"]
    )
    for e in engines:
        s = e.predictions
        predicted.add_metric([e.url], s.predicted_tokens)
        actual.add_metric([e.url], s.actual_tokens)
        under = s.num_observed - s.num_exact - s.num_over
        for result, n in (("exact", s.num_exact), ("over", s.num_over), ("under", under)):
            results.add_metric([e.url, result], n)
    yield from (predicted, actual, results)


def _index_families(engines: list[EngineState]) -> Iterator[Metric]:
    size = GaugeMetricFamily(P + "index_blocks", "keys indexed", labels=["engine", "medium"])
    evictions = CounterMetricFamily(
        P + "index_evictions", "keys forgotten (LRU)", labels=["engine"]
    )
    queued = GaugeMetricFamily(
        P + "engine_queued_tokens", "uncached tokens sent", labels=["engine"]
    )
    cost = GaugeMetricFamily(
        P + "engine_prefill_token_seconds", "measured prefill seconds per token", labels=["engine"]
    )
    for e in engines:
        for medium in sorted(e.index.media()):
            size.add_metric([e.url, medium], e.index.count(medium))
        evictions.add_metric([e.url], e.index.stats.num_evictions)
        queued.add_metric([e.url], e.queued_tokens)
        cost.add_metric([e.url], e.token_seconds)
    yield from (size, evictions, queued, cost)


_EVENT_COUNTERS = (
    ("kv_events_batches", "event batches applied", "index", "num_batches"),
    ("kv_events_clears", "indexes cleared (reset, restart, engine down)", "index", "num_clears"),
    ("kv_events_gaps", "batches missing in the sequence", "sub", "num_gaps"),
    ("kv_events_malformed", "messages that were not KV event batches", "sub", "num_malformed"),
    ("kv_events_unknown_publisher", "messages of another topic or rank", "sub", "num_unknown_publisher"),
    ("kv_events_replays", "replays answered", "sub", "num_replays"),
    ("kv_events_replay_failures", "gaps no replay filled", "sub", "num_replay_failures"),
    ("kv_events_restarts", "publisher restarts seen", "sub", "num_restarts"),
)  # fmt: skip


def _event_families(engines: list[EngineState]) -> Iterator[Metric]:
    for name, help_, owner, attr in _EVENT_COUNTERS:
        family = CounterMetricFamily(P + name, help_, labels=["engine"])
        for e in engines:
            stats: object = e.index.stats if owner == "index" else _sub_stats(e)
            if stats is not None:
                family.add_metric([e.url], getattr(stats, attr))
        yield family
    lag = GaugeMetricFamily(
        P + "kv_events_lag_seconds", "receive time - batch ts", labels=["engine"]
    )
    for e in engines:
        if e.subscriber is not None:
            lag.add_metric([e.url], e.subscriber.stats.lag_seconds)
    yield lag


def _sub_stats(engine: EngineState) -> object:
    return engine.subscriber.stats if engine.subscriber is not None else None
