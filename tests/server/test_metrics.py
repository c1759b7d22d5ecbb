"""metrics.py on its own: a published snapshot is what /metrics says; request observations."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.metrics import (
    EngineStatsSnapshot,
    GroupCacheStats,
    KVTransferStats,
    ServerMetrics,
)


def parse(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_transfer_counters_by_name() -> None:
    t = KVTransferStats.from_counters(
        {
            "load_failures.checksum": 2,
            "load_failures.timeout": 1,
            "recomputed_tokens": 48,
            "offload_bytes.disk.store": 4096,
            "offload_seconds.cpu.load": 0.25,
            "lookups": 7,
            "connector.fast.hits.remote": 3,
        }
    )
    assert t.load_failures == {"checksum": 2, "timeout": 1}
    assert t.recomputed_tokens == 48
    assert t.offload_bytes == {("disk", "store"): 4096}
    assert t.offload_seconds == {("cpu", "load"): 0.25}
    assert t.other == {"lookups": 7}
    assert t.by_connector == {("fast", "hits.remote"): 3}


def test_snapshot_is_the_one_source() -> None:
    metrics = ServerMetrics()
    m = parse(metrics)
    assert m["hybridkv:num_requests_running"] == 0
    assert m["hybridkv:offload_bytes_total{direction=load,tier=remote}"] == 0
    snap = EngineStatsSnapshot(
        num_running=3,
        num_waiting=2,
        kv_usage=0.25,
        num_preemptions=1,
        prefix_cache_queries=4,
        prefix_cache_queried_tokens=100,
        prefix_cache_hit_tokens=32,
        groups=(
            GroupCacheStats(0, "full_attention", 100, 48),
            GroupCacheStats(1, "state", 100, 32),
        ),
        transfer=KVTransferStats.from_counters(
            {
                "load_failures.checksum": 2,
                "offload_bytes.disk.store": 4096,
                "recomputed_tokens": 16,
                "connector.slow.load_failures:timeout": 1,
            }
        ),
    )
    metrics.publish(snap)
    m = parse(metrics)
    assert m["hybridkv:num_requests_running"] == 3
    assert m["hybridkv:num_requests_waiting"] == 2
    assert m["hybridkv:kv_cache_usage_perc"] == 0.25
    assert m["hybridkv:num_preemptions_total"] == 1
    assert m["hybridkv:prefix_cache_hit_tokens_total"] == 32
    assert m["hybridkv:prefix_cache_hits_total{group=0,kind=full_attention}"] == 48
    assert m["hybridkv:prefix_cache_queries_total{group=1,kind=state}"] == 100
    assert m["hybridkv:kv_load_failures_total{reason=checksum}"] == 2
    assert m["hybridkv:offload_bytes_total{direction=store,tier=disk}"] == 4096
    assert m["hybridkv:recomputed_tokens_total"] == 16
    name = "hybridkv:kv_connector_child_events_total{connector=slow,name=load_failures:timeout}"
    assert m[name] == 1


def _output(rid: str, n: int, finished: bool, cached: dict[str, int]) -> RequestOutput:
    reason = "stop" if finished else None
    completion = CompletionOutput(0, "x" * n, list(range(n)), reason)
    return RequestOutput(rid, None, [1, 2, 3], [completion], finished, 3, cached_tokens=cached)


def test_request_metrics() -> None:
    metrics = ServerMetrics()
    rec = metrics.requests
    rec.on_arrival("r", 10.0)
    rec.on_output(_output("r", 1, False, {}), 10.5)
    rec.on_output(_output("r", 3, True, {"local": 16, "disk": 32}), 11.5)
    rec.on_output(_output("unknown", 1, True, {}), 12.0)  # not tracked: ignored
    m = parse(metrics)
    assert m["hybridkv:time_to_first_token_seconds_sum"] == 0.5
    assert m["hybridkv:inter_token_latency_seconds_count"] == 2
    assert m["hybridkv:inter_token_latency_seconds_sum"] == 1.0
    assert m["hybridkv:e2e_request_latency_seconds_sum"] == 1.5
    assert m["hybridkv:requests_finished_total{finish_reason=stop}"] == 1
    assert m["hybridkv:prompt_tokens_total"] == 3
    assert m["hybridkv:generation_tokens_total"] == 3
    assert m["hybridkv:cached_prompt_tokens_total{source=disk}"] == 32
    assert m["hybridkv:cached_prompt_tokens_total{source=peer}"] == 0


def test_registries_are_per_server() -> None:
    a, b = ServerMetrics(), ServerMetrics()  # a global registry would refuse the second
    a.publish(EngineStatsSnapshot(num_running=5))
    assert parse(b)["hybridkv:num_requests_running"] == 0
