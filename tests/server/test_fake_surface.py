"""The vLLM-user surface of the server over the fake engine: unknown fields, lists of prompts,
``n``, ``echo``, log-probability shapes, chat template options, model defaults."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.fake_engine import FakeEngine, expected_text
from tests.server.harness import ThreadedServer

MODEL = "fake-model"


def serve(**state_kw: Any) -> ThreadedServer:
    fake = FakeEngine(max_model_len=256)
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, fake.tokenizer, MODEL, fake.max_model_len, **state_kw)
    return ThreadedServer(create_app(state))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve() as server:
        yield server.url


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json={"model": MODEL, **body}, timeout=30)


def test_unknown_fields_are_ignored_with_a_warning(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hybridkv.server"):
        r = post(url, "/v1/completions", {"prompt": "a", "max_tokens": 2, "store": True,
                                          "metadata": {"x": 1}})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "bc"
    warnings = [m for m in caplog.messages if "not used by this server" in m]
    assert len(warnings) == 1 and "'metadata', 'store'" in warnings[0]


def test_schema_errors_are_400_in_openai_shape(url: str) -> None:
    r = post(url, "/v1/completions", {"prompt": "a", "max_tokens": "5"})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "max_tokens: Input should be a valid integer",
                                  "type": "invalid_request_error", "param": "max_tokens",
                                  "code": "int_type"}}  # fmt: skip


def test_list_of_prompts_and_n(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=["ab", "xy"], max_tokens=3, n=2)
    got = [(c.index, c.text) for c in r.choices]
    assert got == [(0, "cde"), (1, "cde"), (2, "zab"), (3, "zab")]
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 12
    ids = client.completions.create(model=MODEL, prompt=[[97], [120]], max_tokens=2)
    assert [c.text for c in ids.choices] == ["bc", "yz"]
    stream = client.completions.create(model=MODEL, prompt=["ab", "xy"], max_tokens=5, n=2,
                                       stream=True, stream_options={"include_usage": True})  # fmt: skip
    texts: dict[int, str] = {}
    usage = None
    for c in stream:
        usage = c.usage or usage
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "cdefg", 1: "cdefg", 2: "zabcd", 3: "zabcd"}
    assert usage is not None and usage.completion_tokens == 20


def test_best_of_checks(url: str) -> None:
    r = post(url, "/v1/completions", {"prompt": "a", "n": 3, "best_of": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    r = post(url, "/v1/completions", {"prompt": "a", "best_of": 2, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    r = post(url, "/v1/completions", {"prompt": "a", "max_tokens": 2, "best_of": 3})
    assert [c["index"] for c in r.json()["choices"]] == [0]  # best_of only selects


def test_echo_and_top_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="ab", max_tokens=2, echo=True)
    assert r.choices[0].text == "abcd"
    r = client.completions.create(model=MODEL, prompt="ab", max_tokens=2, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["a", "b", "c", "d"]
    assert lp.token_logprobs == [None, None, -0.5, -0.5]  # the fake has no prompt logprobs
    assert lp.top_logprobs == [None, None, {"c": -0.5}, {"d": -0.5}]
    assert lp.text_offset == [0, 1, 2, 3]
    stream = client.completions.create(model=MODEL, prompt="ab", max_tokens=3, echo=True,
                                       stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in stream) == "abcde"


def test_chat_logprobs_and_n(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "a"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, n=2,
                                       logprobs=True, top_logprobs=1)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    content = r.choices[0].logprobs.content
    assert [t.token for t in content] == list(r.choices[0].message.content)
    assert content[0].top_logprobs[0].logprob == -0.5
    r = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3


def test_chat_template_options(url: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]  # fmt: skip
    kw = {"enable_thinking": False}
    r = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1,
                                           "chat_template_kwargs": kw})  # fmt: skip
    want = "<user>a\nb[enable_thinking=False]<assistant>"
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = post(url, "/v1/chat/completions", {"messages": image})
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = post(url, "/v1/chat/completions", {"messages": messages, "tools": tools,
                                           "tool_choice": "auto"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = post(url, "/v1/chat/completions", {"messages": messages, "tools": tools,
                                           "tool_choice": "none", "max_tokens": 1})  # fmt: skip
    assert r.status_code == 200
    r = post(url, "/v1/chat/completions", {"messages": messages, "continue_final_message": True})
    assert r.status_code == 400 and "continue_final_message" in r.json()["error"]["message"]


def test_response_format_is_checked(url: str) -> None:
    messages = [{"role": "user", "content": "a"}]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    r = post(url, "/v1/chat/completions", {"messages": messages, "response_format": schema,
                                           "max_tokens": 1})  # fmt: skip
    assert r.status_code == 200
    bad = {"type": "json_schema", "json_schema": {"name": "x"}}
    r = post(url, "/v1/chat/completions", {"messages": messages, "response_format": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = post(url, "/v1/completions", {"prompt": "a", "structured_outputs": {}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"


def test_generation_config_defaults_apply_unless_set() -> None:
    with serve(sampling_defaults={"max_tokens": 3, "temperature": 0.5}) as server:
        r = post(server.url, "/v1/completions", {"prompt": "a"})
        assert r.json()["choices"][0]["text"] == expected_text("a", 3)
        r = post(server.url, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert r.json()["choices"][0]["text"] == expected_text("a", 2)


def test_stream_of_chat_with_n(url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
            "n": 2, "stream": True}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        events = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    firsts = [c["choices"][0] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert sorted(c["index"] for c in firsts) == [0, 1]


def test_requests_are_logged_unless_disabled(caplog: pytest.LogCaptureFixture) -> None:
    for log_requests in (True, False):
        caplog.clear()
        with serve(log_requests=log_requests) as server, caplog.at_level(logging.INFO):
            post(server.url, "/v1/completions", {"prompt": "a", "max_tokens": 2, "seed": 7})
            post(server.url, "/v1/completions", {"prompt": "a", "max_tokens": 0})
        received = [m for m in caplog.messages if m.startswith("received request")]
        assert len(received) == (1 if log_requests else 0)
        if log_requests:
            assert "1 prompt tokens, SamplingParams(max_tokens=2, seed=7)" in received[0]
        refused = [m for m in caplog.messages if m.startswith("refused POST /v1/completions")]
        assert len(refused) == 1 and "400 invalid_request_error [max_tokens]" in refused[0]
