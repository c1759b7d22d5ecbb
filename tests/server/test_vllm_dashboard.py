"""vLLM's example Grafana dashboard reads hybridkv's /metrics unchanged (the fake-engine
server; ``test_openai_server.py`` checks the same on the real one)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.dashboard import dashboard_problems, dashboard_queries, needed_samples
from tests.server.fake_engine import FakeEngine
from tests.server.harness import ThreadedServer, scrape

MODEL = "dashboard-model"
CACHE_INFO = {"block_size": 4, "num_blocks": 64, "enable_prefix_caching": True}


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    fake = FakeEngine(step_delay=0.002)
    metrics = ServerMetrics(MODEL, CACHE_INFO)
    state = ServerState(AsyncEngine(fake, metrics), metrics, fake.tokenizer, MODEL,  # type: ignore[arg-type]
                        fake.max_model_len)  # fmt: skip
    with ThreadedServer(create_app(state)) as srv:
        yield srv


def test_the_fixture_names_every_panel_of_the_dashboard() -> None:
    """The fixture is the dashboard's query list (a typo in it would test nothing)."""
    queries = dashboard_queries()
    families = {family for family, _ in needed_samples(queries).values()}
    assert len(queries) >= 20
    assert {
        "vllm:e2e_request_latency_seconds", "vllm:prompt_tokens", "vllm:generation_tokens",
        "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
        "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc",
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_success",
        "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds", "vllm:request_max_num_generation_tokens",
    } <= families  # fmt: skip


def test_every_dashboard_query_resolves(server: ThreadedServer) -> None:
    for prompt, max_tokens in (("abc", 5), ("hello", 1)):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert dashboard_problems(text, MODEL) == []
    m = scrape(server.url)
    # what the panels show: tokens in and out, finish reasons by vLLM's label
    assert m["vllm:prompt_tokens_total"] == 3 + 5
    assert m["vllm:generation_tokens_total"] == 5 + 1
    assert m["vllm:request_success_total{finished_reason=length}"] == 2
    assert m["vllm:request_max_num_generation_tokens_sum"] == 5 + 1
    assert m["vllm:e2e_request_latency_seconds_count"] == 2
    # vLLM's prefix-cache counters are prompt tokens over the whole request, not per group
    assert m["vllm:prefix_cache_queries_total"] == 3 + 5
    assert m["vllm:prefix_cache_hits_total"] == 0


def test_the_dashboard_variable_finds_the_model(server: ThreadedServer) -> None:
    """``label_values({__name__=~"vllm:.*"}, model_name)``: every vllm: sample names the model,
    and vllm:cache_config_info says the block size and the prefix-match unit."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    samples = [
        s for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")
        for s in f.samples
    ]  # fmt: skip
    assert samples and {s.labels["model_name"] for s in samples} == {MODEL}
    info = next(s for s in samples if s.name == "vllm:cache_config_info")
    assert (info.labels["block_size"], info.labels["prefix_match_unit"]) == ("4", "4")
    assert info.labels["num_gpu_blocks"] == "64"


def test_a_missing_metric_is_reported() -> None:
    """The checker itself: a page without the dashboard's names fails it, naming them."""
    problems = dashboard_problems("# TYPE vllm:num_requests_running counter\n", MODEL)
    assert any("vllm:num_requests_running: vllm:num_requests_running is a counter" in p
               for p in problems)  # fmt: skip
    assert any(p.startswith("vllm:kv_cache_usage_perc: no family") for p in problems)
