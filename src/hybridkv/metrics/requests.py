"""Per-request metrics of the server, observed from each ``RequestOutput`` on the engine thread:
finish reasons, token counts and lengths, latencies (queue, prefill, decode, first token,
between tokens, end to end), cached prompt tokens by source. Names and meanings are listed in
``prometheus.METRICS``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from hybridkv.engine.output import RequestOutput

CACHE_SOURCES = ("local", "cpu", "disk", "remote", "peer")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's 1-2-5 series for lengths, and its iteration-token buckets
LENGTH_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))
ITERATION_BUCKETS = (1.0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HISTOGRAM_BUCKETS = {
    "request_prompt_tokens": LENGTH_BUCKETS,
    "request_generation_tokens": LENGTH_BUCKETS,
    "iteration_tokens_total": ITERATION_BUCKETS,
}


class Spec(Protocol):  # prometheus.MetricSpec
    @property
    def kind(self) -> str: ...
    @property
    def labels(self) -> tuple[str, ...]: ...
    @property
    def help(self) -> str: ...


def create_request_metrics(
    registry: CollectorRegistry, specs: dict[str, Any], prefix: str
) -> dict[str, Any]:
    """One prometheus_client metric per per-request entry of ``specs``."""
    made: dict[str, Any] = {}
    spec: Spec
    for name, spec in specs.items():
        if spec.kind == "counter":
            made[name] = Counter(prefix + name, spec.help, spec.labels, registry=registry)
        else:
            buckets = HISTOGRAM_BUCKETS.get(name, LATENCY_BUCKETS)
            made[name] = Histogram(prefix + name, spec.help, spec.labels, registry=registry,
                                   buckets=buckets)  # fmt: skip
    for source in CACHE_SOURCES:
        made["cached_prompt_tokens"].labels(source)  # every source shows, at zero until used
    return made


@dataclass(slots=True)
class _Timing:
    arrival: float
    first_token_time: float | None = None
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
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        num_new = num_tokens - t.num_tokens
        if num_new > 0:
            if t.last_token_time is None:
                self._m["time_to_first_token_seconds"].observe(now - t.arrival)
                t.first_token_time = now
            else:
                for _ in range(num_new):
                    gap = (now - t.last_token_time) / num_new
                    self._m["inter_token_latency_seconds"].observe(gap)
            t.last_token_time, t.num_tokens = now, num_tokens
        if out.finished:
            self._on_finished(out, t, now)
            del self._timings[out.request_id]

    def _on_finished(self, out: RequestOutput, t: _Timing, now: float) -> None:
        m = self._m
        m["e2e_request_latency_seconds"].observe(now - t.arrival)
        m["requests_finished"].labels(out.finish_reason or "unknown").inc()
        m["prompt_tokens"].inc(out.num_prompt_tokens)
        m["generation_tokens"].inc(t.num_tokens)
        m["request_prompt_tokens"].observe(out.num_prompt_tokens)
        m["request_generation_tokens"].observe(t.num_tokens)
        queue, ttft = out.metrics.get("queue_s"), out.metrics.get("ttft_s")
        if queue is not None:
            m["request_queue_time_seconds"].observe(queue)
            if ttft is not None:
                m["request_prefill_time_seconds"].observe(max(ttft - queue, 0.0))
        if t.first_token_time is not None and t.last_token_time is not None:
            m["request_decode_time_seconds"].observe(t.last_token_time - t.first_token_time)
        for source, n in out.cached_tokens.items():
            if n:
                m["cached_prompt_tokens"].labels(source).inc(n)
