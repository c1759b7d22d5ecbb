"""The one list of the server's metrics: full name -> type, labels, meaning.

Two prefixes. ``vllm:`` families carry vLLM's name **and** vLLM's meaning (a dashboard or an
alert written for vLLM reads them unchanged: ``tests/server/data/vllm_dashboard_queries.txt``);
``hybridkv:`` families are the richer ones vLLM has no name for (per layout group, per tier,
per connector, server limits). No fact is exported under both prefixes, except
``vllm:time_per_output_token_seconds``, the name vLLM deprecated for
``vllm:inter_token_latency_seconds`` and older dashboards still query. docs/metrics.md lists
the same names in the same order (a test checks).
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM = "vllm:"
HYBRIDKV = "hybridkv:"
MODEL_LABEL = "model_name"  # on every sample (vLLM's)

# vllm:cache_config_info's labels: vLLM's CacheConfig fields a dashboard reads
VLLM_CACHE_INFO_LABELS = (
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "num_gpu_blocks",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
)
# hybridkv:cache_config_info's labels: what a hybrid layout adds
CACHE_INFO_LABELS = (
    "block_size",
    "num_blocks",
    "num_state_slots",
    "num_layout_groups",
    "enable_prefix_caching",
    "cache_dtype",
    "kv_cache_memory",
    "state_checkpoint_interval",
)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    kind: str  # gauge | counter | histogram
    labels: tuple[str, ...]
    help: str


def _g(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("gauge", labels, help)


def _c(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("counter", labels, help)


def _h(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("histogram", labels, help)


# engine state, from EngineStats (prometheus.py's collector)
ENGINE_METRICS: dict[str, MetricSpec] = {
    "vllm:num_requests_running": _g("requests in the running batch"),
    "vllm:num_requests_waiting": _g("requests waiting to be scheduled"),
    "vllm:kv_cache_usage_perc": _g("fraction of KV blocks in use (1 = 100%)"),
    "vllm:num_preemptions": _c("preemptions (requests sent back to wait)"),
    "vllm:prefix_cache_queries": _c("prompt tokens looked up in the prefix cache"),
    "vllm:prefix_cache_hits": _c("prompt tokens hit in the prefix cache (valid in every group)"),
    "vllm:iteration_tokens_total": _h("tokens computed per engine step (prompt + generated)"),
    "vllm:cache_config_info": _g("the KV cache's configuration", *VLLM_CACHE_INFO_LABELS),
    "hybridkv:num_requests_waiting_for_remote_kv": _g(
        "requests waiting for an asynchronous KV load (also counted as waiting)"
    ),
    "hybridkv:prefix_cache_lookups": _c("prefix-cache lookups"),
    "hybridkv:prompt_tokens_computed": _c("prompt tokens computed by engine steps (hits excluded)"),
    "hybridkv:prompt_compute_seconds": _c(
        "engine step seconds spent on prompt tokens (each step's share: its prompt tokens / "
        "all its tokens); over prompt_tokens_computed: the measured prefill cost per token"
    ),
    "hybridkv:inflight_prefix_waits": _c(
        "requests that waited for a running prefill computing their next blocks (sched/inflight.py)"
    ),
    "hybridkv:inflight_prefix_wait_steps": _c("schedule passes requests spent waiting for one"),
    "hybridkv:inflight_prefix_waits_expired": _c("such waits ended by their bound, not the source"),
    "hybridkv:inflight_prefix_hit_tokens": _c("prompt tokens hit that a wait for a prefill gained"),
    "hybridkv:group_prefix_cache_queries": _c(
        "prompt tokens looked up, per group", "group", "kind"
    ),
    "hybridkv:group_prefix_cache_hits": _c(
        "each group's own prefix hits in tokens", "group", "kind"
    ),
    "hybridkv:state_checkpoints_admitted": _c("state checkpoints kept, by kind", "kind"),
    "hybridkv:state_checkpoints_refused": _c(
        "due state checkpoints not kept (worth less than the budget's)", "kind"
    ),
    "hybridkv:state_checkpoints_evicted": _c("state checkpoints evicted", "reason"),
    "hybridkv:state_checkpoint_hits": _c("state checkpoints restored", "kind"),
    "hybridkv:state_checkpoint_bytes": _g("bytes the state checkpoints hold"),
    "hybridkv:state_checkpoint_budget_bytes": _g(
        "bytes state_checkpoint_budget allows (0: no state layers)"
    ),
    "hybridkv:kv_load_failures": _c("KV connector load failures, by reason", "reason"),
    "hybridkv:recomputed_tokens": _c("tokens recomputed after failed KV loads"),
    "hybridkv:offload_bytes": _c("bytes moved to or from offload tiers", "tier", "direction"),
    "hybridkv:offload_seconds": _c("seconds spent moving offloaded KV", "tier", "direction"),
    "hybridkv:kv_connector_events": _c("other KV connector counters, by name", "name"),
    "hybridkv:kv_connector_child_events": _c(
        "a MultiConnector child's counters (hits, tokens, bytes, failures...), by child",
        "connector",
        "name",
    ),
    "hybridkv:kv_events_published_batches": _c("KV event batches published (--kv-events-config)"),
    "hybridkv:kv_events_dropped_batches": _c(
        "KV event batches dropped, oldest first, while the publisher fell behind"
    ),
    "hybridkv:cache_config_info": _g("the hybrid KV cache's configuration", *CACHE_INFO_LABELS),
    # server limits, from the HTTP layer
    "hybridkv:requests_refused": _c(
        "requests refused before the engine saw them (server limits), by reason", "reason"
    ),
    "hybridkv:stalled_clients_disconnected": _c(
        "connections closed because the client read none of its response for "
        "--stream-stall-seconds (its request aborted)"
    ),
}

# per request, from RequestOutputs (requests.py)
REQUEST_METRICS: dict[str, MetricSpec] = {
    "vllm:request_success": _c("finished requests, by finish reason", "finished_reason"),
    "vllm:prompt_tokens": _c("prompt tokens of requests that produced their first token"),
    "vllm:generation_tokens": _c("generated tokens"),
    "vllm:time_to_first_token_seconds": _h("arrival to first token"),
    "vllm:inter_token_latency_seconds": _h("time between output tokens"),
    "vllm:time_per_output_token_seconds": _h(
        "time between output tokens (vLLM's deprecated name of inter_token_latency_seconds)"
    ),
    "vllm:request_time_per_output_token_seconds": _h(
        "per request: (finish - first token) / (generated tokens - 1); 0 for one token"
    ),
    "vllm:e2e_request_latency_seconds": _h("arrival to finish"),
    "vllm:request_queue_time_seconds": _h("arrival in the engine to first scheduled"),
    "vllm:request_prefill_time_seconds": _h("first scheduled to first token"),
    "vllm:request_decode_time_seconds": _h("first token to last token"),
    "vllm:request_inference_time_seconds": _h("first scheduled to last token"),
    "vllm:request_prompt_tokens": _h("prompt length of finished requests"),
    "vllm:request_generation_tokens": _h("tokens generated by finished requests (all n choices)"),
    "vllm:request_max_num_generation_tokens": _h(
        "the longest choice of each finished request, in tokens"
    ),
    "vllm:request_params_n": _h("the n of finished requests"),
    "vllm:request_params_max_tokens": _h("the max_tokens of finished requests"),
    "hybridkv:cached_prompt_tokens": _c("prompt tokens not computed, by source", "source"),
}

METRICS: dict[str, MetricSpec] = {**ENGINE_METRICS, **REQUEST_METRICS}
