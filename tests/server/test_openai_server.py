"""The real server (``python -m hybridkv serve`` in a subprocess, a tiny random hybrid
checkpoint) through the official openai client: greedy outputs equal ``LLM.generate``,
concurrency, disconnects, prefix-cache metrics, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server.harness import SubprocessServer, scrape, wait_for
from tests.support.lifetimes import track

pytestmark = pytest.mark.slow

ENGINE_FLAGS = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "48", "--seed", "0"]
# vLLM's flags with no job here, as a vLLM launch script passes them (accepted, one warning)
VLLM_GPU_FLAGS = "--gpu-memory-utilization 0.9 --enforce-eager --tensor-parallel-size 1 "
VLLM_GPU_FLAGS += "--trust-remote-code --swap-space 4 --enable-chunked-prefill"
ENGINE_OPTIONS: dict[str, Any] = {"kv_cache_memory": "64MiB", "max_num_seqs": 48, "seed": 0}
NAME = "tiny-hybrid"
PROMPTS = [
    "The key to a fast inference engine is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "hybrid models mix attention and state",
]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--model", str(model_dir), "--served-model-name", NAME, *ENGINE_FLAGS]
    args += VLLM_GPU_FLAGS.split()
    with SubprocessServer(args, log) as srv:
        yield srv


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Any:
    from hybridkv import LLM

    return track(LLM(str(model_dir), **ENGINE_OPTIONS))


@pytest.fixture(scope="module")
def client(server: SubprocessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(max_tokens: int) -> Any:
    from hybridkv import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def test_completions_match_llm_generate(client: openai.OpenAI, llm: Any) -> None:
    expected = llm.generate(PROMPTS, greedy(12), use_tqdm=False)
    for prompt, want in zip(PROMPTS, expected, strict=True):
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text == want.text
        assert r.choices[0].finish_reason == want.finish_reason
        assert r.usage.prompt_tokens == want.num_prompt_tokens
        assert r.usage.completion_tokens == len(want.token_ids)
        stream = client.completions.create(
            model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in stream) == want.text


def test_token_id_prompt(client: openai.OpenAI, llm: Any) -> None:
    ids = llm.tokenizer.encode(PROMPTS[0])
    want = llm.generate([ids], greedy(6), use_tqdm=False)[0]
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0)
    assert r.choices[0].text == want.text


def test_chat_matches_llm_chat(client: openai.OpenAI, llm: Any) -> None:
    messages = [{"role": "user", "content": "Say something about caches."}]
    want = llm.chat(messages, greedy(10), use_tqdm=False)[0]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].message.content == want.text
    chunks = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_32_concurrent_streams(client: openai.OpenAI, llm: Any) -> None:
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(32)]
    expected = [o.text for o in llm.generate(prompts, greedy(16), use_tqdm=False)]

    def run(prompt: str) -> str:
        stream = client.completions.create(
            model=NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(run, prompts))
    assert got == expected


def test_disconnect_frees_blocks(server: SubprocessServer) -> None:
    idle = scrape(server.url)
    assert idle["vllm:num_requests_running"] == 0
    body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 2000, "ignore_eos": True}
    body |= {"temperature": 0, "stream": True}  # runs for seconds unless aborted
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = (x for x in r.iter_lines() if x.startswith("data: "))
        first = [json.loads(next(lines)[6:]) for _ in range(3)]
        assert all(c["choices"][0]["finish_reason"] is None for c in first)
        busy = scrape(server.url)
        assert busy["vllm:num_requests_running"] == 1
        assert busy["vllm:kv_cache_usage_perc"] > idle["vllm:kv_cache_usage_perc"]
    wait_for(
        lambda: scrape(server.url)["vllm:num_requests_running"] == 0,
        timeout=30,
        what="the disconnected request to be aborted",
    )
    after = scrape(server.url)
    assert after["vllm:kv_cache_usage_perc"] == idle["vllm:kv_cache_usage_perc"]
    assert after["vllm:request_success_total{finished_reason=abort}"] >= 1


def test_repeated_prompt_hits_the_prefix_cache(
    client: openai.OpenAI, server: SubprocessServer
) -> None:
    prompt = " ".join(f"word{i}" for i in range(40))  # several blocks
    before = scrape(server.url)["vllm:prefix_cache_hits_total"]
    first = client.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].text == first.choices[0].text
    m = scrape(server.url)
    assert m["vllm:prefix_cache_hits_total"] - before >= second.usage.prompt_tokens_details.cached_tokens  # fmt: skip
    assert m["hybridkv:cached_prompt_tokens_total{source=local}"] > 0
    assert any(
        k.startswith("hybridkv:group_prefix_cache_hits_total{") and v > 0 for k, v in m.items()
    )


def test_vllm_gpu_flags_are_accepted_with_one_warning(server: SubprocessServer) -> None:
    warnings = [line for line in server.log().splitlines() if "ignoring vLLM options" in line]
    assert len(warnings) == 1
    for flag in VLLM_GPU_FLAGS.split():
        if flag.startswith("--"):
            assert flag in warnings[0]
    assert httpx.get(server.url + "/version").json()["version"]
    assert httpx.get(server.url + "/ping").status_code == 200


def test_vllm_dashboard_resolves(client: openai.OpenAI, server: SubprocessServer) -> None:
    """Every query of vLLM's example Grafana dashboard finds its metric, typed, with a series
    for the served model, on the real server (tests/server/test_vllm_dashboard.py: the fake)."""
    from tests.server.dashboard import dashboard_problems

    client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert dashboard_problems(httpx.get(server.url + "/metrics", timeout=10).text, NAME) == []
    info = scrape(server.url)
    key = next(k for k in info if k.startswith("vllm:cache_config_info{"))
    assert "block_size=16" in key and "prefix_match_unit=16" in key


def test_bad_input_keeps_serving(client: openai.OpenAI, server: SubprocessServer, llm: Any) -> None:
    too_long = [1] * llm.engine.max_model_len
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=NAME, prompt=too_long, max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=0)
    r = httpx.post(server.url + "/v1/completions", content=b"{", headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # options that leave the sampler nothing to pick (only EOS allowed, EOS banned by
    # min_tokens) fail in the engine, as the client's error: a 400 it must not retry
    eos = min(llm.engine.model_config.eos_token_ids)
    body = {"model": NAME, "prompt": "hi", "max_tokens": 4, "min_tokens": 2,
            "allowed_token_ids": [eos]}  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "leave no token to sample" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert client.completions.create(model=NAME, prompt="hi", max_tokens=2).usage.completion_tokens >= 1  # fmt: skip
    assert httpx.get(server.url + "/health").status_code == 200
