"""The proxy's own Prometheus metrics (routing outcomes, failures and health by engine)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hybridkv.proxy.health import PROBE_RESULTS
from hybridkv.proxy.router import Router
from hybridkv.proxy.routing.metrics import routing_families
from hybridkv.proxy.routing.service import KVRouting


class _RouterCollector(Collector):
    def __init__(
        self, router: Router, kv: KVRouting | None, probes: dict[tuple[str, str], int]
    ) -> None:
        self.router = router
        self.kv = kv
        self.probes = probes  # (engine, result) -> /health probes (health.py)

    def collect(self):  # type: ignore[no-untyped-def]
        stats = self.router.stats
        requests = CounterMetricFamily(
            "hybridkv_proxy_requests", "requests routed, by outcome", labels=["outcome"]
        )
        for outcome, n in stats.requests.items():
            requests.add_metric([outcome.value], n)
        yield requests
        failures = CounterMetricFamily(
            "hybridkv_proxy_engine_failures",
            "failed calls to an engine (connection errors, 5xx)",
            labels=["role", "engine"],
        )
        for role, table in (("prefill", stats.prefill_failures), ("decode", stats.decode_failures)):
            for url, n in table.items():
                failures.add_metric([role, url], n)
        yield failures
        healthy = GaugeMetricFamily(
            "hybridkv_proxy_engine_healthy",
            "1 if the engine's last /health probe answered 200 in time, else 0",
            labels=["role", "engine"],
        )
        for role, url in self.router.engines():
            healthy.add_metric([role, url], float(self.router.healthy[url]))
        yield healthy
        probes = CounterMetricFamily(
            "hybridkv_proxy_health_probes",
            "/health probes by result: ok, slow (no answer in time, but the engine is sending "
            "answers), unhealthy (non-200), refused, timeout (no answer, nothing sent)",
            labels=["engine", "result"],
        )
        for _, url in self.router.engines():
            for result in PROBE_RESULTS:  # every result shows, at zero until seen
                probes.add_metric([url, result], self.probes.get((url, result), 0))
        yield probes
        if self.kv is not None:
            yield from routing_families(self.kv)


def render_metrics(
    router: Router,
    kv: KVRouting | None = None,
    probes: dict[tuple[str, str], int] | None = None,
) -> bytes:
    registry = CollectorRegistry()
    registry.register(_RouterCollector(router, kv, probes or {}))
    return generate_latest(registry)
