"""Per-request metrics of the server, observed from each ``RequestOutput`` on the engine thread:
finish reasons, token counts and lengths, latencies (queue, prefill, decode, first token,
between tokens, end to end), cached prompt tokens by source. Names and meanings are listed in
``table.METRICS``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from hybridkv.engine.output import RequestOutput

CACHE_SOURCES = ("local", "cpu", "disk", "remote", "peer")
FINISH_REASONS = ("stop", "length", "abort", "error")  # each shows at zero until used (vLLM's)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's 1-2-5 series for lengths, and its iteration-token buckets
LENGTH_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))
ITERATION_BUCKETS = (1.0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HISTOGRAM_BUCKETS = {
    "vllm:request_prompt_tokens": LENGTH_BUCKETS,
    "vllm:request_generation_tokens": LENGTH_BUCKETS,
    "vllm:request_max_num_generation_tokens": LENGTH_BUCKETS,
    "vllm:request_params_max_tokens": LENGTH_BUCKETS,
    "vllm:request_params_n": (1.0, 2, 5, 10, 20),
}


class Spec(Protocol):  # prometheus.MetricSpec
    @property
    def kind(self) -> str: ...
    @property
    def labels(self) -> tuple[str, ...]: ...
    @property
    def help(self) -> str: ...


def create_request_metrics(registry: CollectorRegistry, specs: dict[str, Any]) -> dict[str, Any]:
    """One prometheus_client metric per per-request entry of ``specs`` (full names)."""
    made: dict[str, Any] = {}
    spec: Spec
    for name, spec in specs.items():
        if spec.kind == "counter":
            made[name] = Counter(name, spec.help, spec.labels, registry=registry)
        else:
            buckets = HISTOGRAM_BUCKETS.get(name, LATENCY_BUCKETS)
            made[name] = Histogram(name, spec.help, spec.labels, registry=registry,
                                   buckets=buckets)  # fmt: skip
    for source in CACHE_SOURCES:
        made["hybridkv:cached_prompt_tokens"].labels(source)  # every source shows, at zero
    for reason in FINISH_REASONS:
        made["vllm:request_success"].labels(reason)
    return made


@dataclass(slots=True)
class _Timing:
    arrival: float
    n: int = 1
    max_tokens: int | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_tokens: int = 0


class RequestMetrics:
    """Latency, token and finish-reason metrics from each request's outputs, counted as vLLM
    counts them: prompt tokens when a request's first token comes, generated tokens as they
    come, the rest when it finishes.

    NOTE: called on the engine thread only (prometheus_client's metrics are thread-safe, the
    timing table is not)."""

    def __init__(self, metrics: dict[str, Any]) -> None:
        self._m = metrics
        self._timings: dict[str, _Timing] = {}

    def on_arrival(
        self, request_id: str, arrival: float, n: int = 1, max_tokens: int | None = None
    ) -> None:
        self._timings[request_id] = _Timing(arrival, n, max_tokens)

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
            self._on_tokens(out, t, num_new, now)
            t.last_token_time, t.num_tokens = now, num_tokens
        if out.finished:
            self._on_finished(out, t, now)
            del self._timings[out.request_id]

    def _on_tokens(self, out: RequestOutput, t: _Timing, num_new: int, now: float) -> None:
        m = self._m
        m["vllm:generation_tokens"].inc(num_new)
        if t.last_token_time is None:
            m["vllm:time_to_first_token_seconds"].observe(now - t.arrival)
            m["vllm:prompt_tokens"].inc(out.num_prompt_tokens)
            t.first_token_time = now
            return
        gap = (now - t.last_token_time) / num_new
        for _ in range(num_new):
            m["vllm:inter_token_latency_seconds"].observe(gap)
            m["vllm:time_per_output_token_seconds"].observe(gap)

    def _on_finished(self, out: RequestOutput, t: _Timing, now: float) -> None:
        m = self._m
        m["vllm:e2e_request_latency_seconds"].observe(now - t.arrival)
        m["vllm:request_success"].labels(out.finish_reason or "unknown").inc()
        m["vllm:request_prompt_tokens"].observe(out.num_prompt_tokens)
        m["vllm:request_generation_tokens"].observe(t.num_tokens)
        m["vllm:request_max_num_generation_tokens"].observe(
            max((len(c.token_ids) for c in out.outputs), default=0)
        )
        m["vllm:request_params_n"].observe(t.n)
        if t.max_tokens is not None:
            m["vllm:request_params_max_tokens"].observe(t.max_tokens)
        self._observe_phases(out, t)
        for source, n in out.cached_tokens.items():
            if n:
                m["hybridkv:cached_prompt_tokens"].labels(source).inc(n)

    def _observe_phases(self, out: RequestOutput, t: _Timing) -> None:
        """Queue, prefill, decode, inference and per-request TPOT (vLLM's phases)."""
        m = self._m
        queue, ttft = out.metrics.get("queue_s"), out.metrics.get("ttft_s")
        first, last = t.first_token_time, t.last_token_time
        decode = last - first if first is not None and last is not None else None
        if decode is not None:
            m["vllm:request_decode_time_seconds"].observe(decode)
            per_token = decode / (t.num_tokens - 1) if t.num_tokens > 1 else 0.0
            m["vllm:request_time_per_output_token_seconds"].observe(per_token)
        if queue is None:
            return
        m["vllm:request_queue_time_seconds"].observe(queue)
        if ttft is not None:
            prefill = max(ttft - queue, 0.0)
            m["vllm:request_prefill_time_seconds"].observe(prefill)
            m["vllm:request_inference_time_seconds"].observe(prefill + (decode or 0.0))
