"""metrics/prometheus.py on its own: a published snapshot is what /metrics says; request observations."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hybridkv.connectors.config import TierName
from hybridkv.connectors.fault.connector import FaultStats
from hybridkv.connectors.offloading.stats import OffloadingStats
from hybridkv.connectors.stats import ConnectorStats, Direction
from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.engine.stats import EngineStats, GroupCacheStats, StepStats, TransferStats
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.step_io import FailureReason
from tests.server.harness import parse_metrics


def parse(metrics: ServerMetrics) -> dict[str, float]:
    return parse_metrics(metrics.render().decode())


def test_connector_stats_fold_children_and_name_events() -> None:
    """Typed stats in, the names /metrics shows out: failures by reason, bytes and seconds by
    (tier, direction), a connector's own counters by their event names, children folded in."""
    inner = OffloadingStats(
        load_failures={FailureReason.CORRUPT: 2, FailureReason.TIMEOUT: 1},
        offload_bytes={(TierName.DISK, Direction.STORE): 4096},
        offload_seconds={(TierName.CPU, Direction.LOAD): 0.25},
        hits={TierName.CPU: 7},
    )
    outer = FaultStats(injected_failures={FailureReason.INJECTED: 1}, children={"inner": inner})
    flat = outer.flatten()
    assert flat.load_failures == {"corrupt": 2, "timeout": 1}
    assert flat.offload_bytes == {("disk", "store"): 4096}
    assert flat.offload_seconds == {("cpu", "load"): 0.25}
    assert flat.events == {"hits.cpu": 7, "injected_failures:injected": 1}
    twice = outer.copy()
    twice.merge(outer)
    assert twice.flatten().events == {"hits.cpu": 14, "injected_failures:injected": 2}
    assert outer.flatten().events["hits.cpu"] == 7  # the copy shares nothing


def test_snapshot_is_the_one_source() -> None:
    metrics = ServerMetrics()
    m = parse(metrics)
    assert m["vllm:num_requests_running"] == 0
    assert m["hybridkv:offload_bytes_total{direction=load,tier=remote}"] == 0
    snap = EngineStats(
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
        transfer=TransferStats(
            recomputed_tokens=16,
            connector=ConnectorStats(
                load_failures={FailureReason.CORRUPT: 2},
                offload_bytes={(TierName.DISK, Direction.STORE): 4096},
                children={  # a MultiConnector child's share, by name
                    "fast": ConnectorStats(offload_bytes={(TierName.REMOTE, Direction.LOAD): 512})
                },
            ),
        ),
    )
    metrics.publish(snap)
    m = parse(metrics)
    assert m["vllm:num_requests_running"] == 3
    assert m["vllm:num_requests_waiting"] == 2
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert m["vllm:num_preemptions_total"] == 1
    assert m["vllm:prefix_cache_hits_total"] == 32
    assert m["vllm:prefix_cache_queries_total"] == 100
    assert m["hybridkv:prefix_cache_lookups_total"] == 4
    assert m["hybridkv:group_prefix_cache_hits_total{group=0,kind=full_attention}"] == 48
    assert m["hybridkv:group_prefix_cache_queries_total{group=1,kind=state}"] == 100
    assert m["hybridkv:kv_load_failures_total{reason=corrupt}"] == 2
    assert m["hybridkv:offload_bytes_total{direction=store,tier=disk}"] == 4096
    assert m["hybridkv:recomputed_tokens_total"] == 16
    assert m["hybridkv:offload_bytes_total{direction=load,tier=remote}"] == 512  # folded in
    name = "hybridkv:kv_connector_child_events_total{connector=fast,name=offload_bytes.remote.load}"
    assert m[name] == 512


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
    assert m["vllm:time_to_first_token_seconds_sum"] == 0.5
    assert m["vllm:inter_token_latency_seconds_count"] == 2
    assert m["vllm:inter_token_latency_seconds_sum"] == 1.0
    assert m["vllm:e2e_request_latency_seconds_sum"] == 1.5
    assert m["vllm:request_success_total{finished_reason=stop}"] == 1
    assert m["vllm:prompt_tokens_total"] == 3
    assert m["vllm:generation_tokens_total"] == 3
    assert m["hybridkv:cached_prompt_tokens_total{source=disk}"] == 32
    assert m["hybridkv:cached_prompt_tokens_total{source=peer}"] == 0


def test_registries_are_per_server() -> None:
    a, b = ServerMetrics(), ServerMetrics()  # a global registry would refuse the second
    a.publish(EngineStats(num_running=5))
    assert parse(b)["vllm:num_requests_running"] == 0


def test_every_metric_is_in_the_one_table() -> None:
    """/metrics renders exactly the families ``METRICS`` lists, with the types and help it says."""
    from hybridkv.metrics.prometheus import METRICS

    families = {
        f.name: f
        for f in text_string_to_metric_families(ServerMetrics().render().decode())
        if not f.name.endswith("_created")  # the server turns these off (launch.py)
    }
    assert set(families) == set(METRICS)
    for name, family in families.items():
        assert (family.type, family.documentation) == (METRICS[name].kind, METRICS[name].help)


def test_every_sample_names_the_model_and_cache_config_is_shown() -> None:
    info = {"block_size": 16, "num_blocks": 100, "enable_prefix_caching": True}
    metrics = ServerMetrics("my-model", info)
    metrics.publish(EngineStats(steps=StepStats(num_steps=1, last_step_tokens=40)))
    metrics.publish(EngineStats(steps=StepStats(num_steps=1, last_step_tokens=40)))  # no step
    samples = [
        s for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples
    ]
    assert samples and all(s.labels["model_name"] == "my-model" for s in samples)
    m = parse(metrics)
    key = "hybridkv:cache_config_info{block_size=16,cache_dtype=,enable_prefix_caching=True,"
    key += "kv_cache_memory=,num_blocks=100,num_layout_groups=,num_state_slots=,"
    key += "state_checkpoint_interval=}"
    assert m[key] == 1.0
    key = "vllm:cache_config_info{block_size=16,cache_dtype=,enable_prefix_caching=True,"
    key += "num_gpu_blocks=100,prefix_caching_hash_algo=,prefix_match_unit=16}"
    assert m[key] == 1.0
    assert m["vllm:iteration_tokens_total_count"] == 1
    assert m["vllm:iteration_tokens_total_sum"] == 40


def test_request_phases_and_lengths() -> None:
    metrics = ServerMetrics()
    rec = metrics.requests
    rec.on_arrival("r", 10.0, n=1, max_tokens=50)
    rec.on_output(_output("r", 1, False, {}), 10.5)
    m = parse(metrics)  # vLLM counts prompt tokens at the first token, output tokens as they come
    assert (m["vllm:prompt_tokens_total"], m["vllm:generation_tokens_total"]) == (3, 1)
    assert m["vllm:request_success_total{finished_reason=stop}"] == 0  # not finished
    done = _output("r", 4, True, {})
    done.metrics = {"queue_s": 0.125, "ttft_s": 0.375}
    rec.on_output(done, 12.0)
    m = parse(metrics)
    assert (m["vllm:prompt_tokens_total"], m["vllm:generation_tokens_total"]) == (3, 4)
    assert m["vllm:request_time_per_output_token_seconds_sum"] == 0.5  # 1.5 s / 3 tokens
    assert m["vllm:request_inference_time_seconds_sum"] == 1.75  # prefill + decode
    assert m["vllm:request_params_max_tokens_sum"] == 50
    assert m["vllm:request_params_n_sum"] == 1
    assert m["vllm:request_max_num_generation_tokens_sum"] == 4
    assert m["vllm:time_per_output_token_seconds_count"] == 3  # vLLM's old name, same gaps
    assert m["vllm:request_queue_time_seconds_sum"] == 0.125
    assert m["vllm:request_prefill_time_seconds_sum"] == 0.25
    assert m["vllm:request_decode_time_seconds_sum"] == 1.5
    assert m["vllm:request_prompt_tokens_sum"] == 3
    assert m["vllm:request_generation_tokens_sum"] == 4
    assert m["vllm:request_generation_tokens_bucket{le=5.0}"] == 1


def test_the_periodic_log_line_reads_the_snapshot() -> None:
    from hybridkv.engine.stats import stats_line

    prev = EngineStats(prefix_cache_queried_tokens=20, prefix_cache_hit_tokens=5)
    now = EngineStats(
        num_running=2,
        num_waiting=1,
        kv_usage=0.5,
        prefix_cache_queried_tokens=120,
        prefix_cache_hit_tokens=30,
        groups=(GroupCacheStats(0, "full_attention", 100, 50),),
        steps=StepStats(2, 8, prompt_tokens=300, generation_tokens=40),
    )
    line = stats_line(now, prev, 10.0)
    assert line.startswith(
        "Avg prompt throughput: 30.0 tokens/s, Avg generation throughput: 4.0 tokens/s, "
        "Running: 2 reqs, Waiting: 1 reqs (loading KV: 0), KV cache usage: 50.0%, "
        "Prefix cache hit rate: 25.0% (per group: 0:full_attention 50.0%)"
    )
    assert "load failures" not in line
    with_connector = EngineStats(
        transfer=TransferStats({FailureReason.CORRUPT: 3}, connector=ConnectorStats())
    )
    assert "KV load failures: 3" in stats_line(with_connector)


def test_docs_list_the_same_metrics() -> None:
    from pathlib import Path

    from hybridkv.metrics.prometheus import METRICS

    doc = Path(__file__).parents[2] / "docs" / "metrics.md"
    names = [
        line.split("|")[1].strip().strip("`")
        for line in doc.read_text().splitlines()
        if line.startswith("| `")
    ]
    assert names == list(METRICS)
