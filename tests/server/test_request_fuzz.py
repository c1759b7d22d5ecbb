"""No combination of well-typed request fields makes the server answer 500: hypothesis draws
bodies for both endpoints (every field the schema knows, values at and beyond their limits,
lone surrogates, tools and tool choices, streaming or not) against a fake-engine server with
tool and reasoning parsers; each answer is a 200 or a 400 naming a field, and no stream
carries a server error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.server.chat_output import ChatParsers
from tests.server.harness import ThreadedServer
from tests.server.scripted_engine import MODEL, make_scripted_app

# a lone surrogate now and then: valid JSON (an escape), not valid Unicode
text = st.one_of(st.text(alphabet=st.sampled_from('ab <>{}"\\/\n\u00e9'), max_size=6),
                 st.just("a\ud800"))  # fmt: skip
ints = st.one_of(st.integers(-3, 30), st.sampled_from([128, 129, 2**31, 2**63 - 1, -(2**63)]))
floats = st.one_of(st.floats(-3, 3, allow_nan=False), st.sampled_from([1e308, -1e308, 0.0]))
token_ids = st.lists(st.one_of(st.integers(-2, 300), st.just(2**40)), max_size=4)
WEATHER = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}  # fmt: skip
structured = st.one_of(
    st.fixed_dictionaries({"choice": st.lists(text, max_size=3)}),
    st.fixed_dictionaries({"regex": text}),
    st.fixed_dictionaries({"json": st.sampled_from([{"type": "object"}, "{}", "{"])}),
    st.fixed_dictionaries({"json_object": st.booleans()}),
    st.fixed_dictionaries({"grammar": text, "choice": st.lists(text, max_size=1)}),
)
response_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"])}),
    st.just({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}),
)
SAMPLING = {
    "max_tokens": ints, "temperature": floats, "top_p": floats, "top_k": ints, "min_p": floats,
    "seed": ints, "stop": st.one_of(text, st.lists(text, max_size=3)), "stop_token_ids": token_ids,
    "ignore_eos": st.booleans(), "n": ints, "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "presence_penalty": floats, "frequency_penalty": floats, "repetition_penalty": floats,
    "min_tokens": ints, "logit_bias": st.dictionaries(st.sampled_from(["1", "-1", "x", "99999"]),
                                                      floats, max_size=2),
    "allowed_token_ids": token_ids, "bad_words": st.lists(text, max_size=2),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
    "truncate_prompt_tokens": ints, "prompt_logprobs": ints, "return_token_ids": st.booleans(),
    "response_format": response_format, "structured_outputs": structured,
    "cache_salt": text, "cache_boundaries": token_ids,
    "kv_transfer_params": st.fixed_dictionaries({"do_remote_prefill": st.booleans()}),
}  # fmt: skip
COMPLETION = {
    **SAMPLING, "prompt": st.one_of(text, token_ids, st.lists(text, min_size=1, max_size=2)),
    "logprobs": ints, "echo": st.booleans(), "best_of": ints, "suffix": st.just(None),
    "add_special_tokens": st.booleans(),
}  # fmt: skip
call = st.fixed_dictionaries({"id": text, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": text, "arguments": st.one_of(text, st.just('{"x": 1}'), st.none())})})  # fmt: skip
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={"content": st.one_of(text, st.none(), st.just([{"type": "text", "text": "hi"}])),
              "tool_calls": st.lists(call, max_size=2), "tool_call_id": text,
              "reasoning_content": text},
)  # fmt: skip
CHAT = {
    **SAMPLING, "messages": st.lists(message, min_size=1, max_size=3), "logprobs": st.booleans(),
    "top_logprobs": ints, "max_completion_tokens": ints, "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(), "chat_template_kwargs": st.just({"k": 1}),
    "tools": st.lists(st.just(WEATHER), max_size=2), "parallel_tool_calls": st.booleans(),
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required", "any"]),
                             st.just({"type": "function", "function": {"name": "f"}})),
}  # fmt: skip


def bodies(fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    required = {k: fields[k] for k in ("prompt", "messages") if k in fields}
    optional = {k: v for k, v in fields.items() if k not in required}
    return st.fixed_dictionaries(required, optional=optional)


SCRIPT = {"user>": '<think>x</think><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """One connection for every example (a new client per request costs ~0.1 s)."""
    app, _ = make_scripted_app(SCRIPT, ChatParsers("hermes", True, "qwen3"), max_model_len=24)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def check(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    data = json.dumps({"model": MODEL, **body})  # lone surrogates go out as \ud800 escapes
    r = client.post(path, content=data, headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400), (body, r.text)
    if r.status_code == 400:
        assert r.json()["error"]["type"] == "invalid_request_error", (body, r.text)
    elif body.get("stream"):
        assert "server_error" not in r.text and r.text.endswith("data: [DONE]\n\n"), (body, r.text)


FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@FUZZ
@given(body=bodies(COMPLETION))
def test_completions_never_500(client: httpx.Client, body: dict[str, Any]) -> None:
    check(client, "/v1/completions", body)


@FUZZ
@given(body=bodies(CHAT))
def test_chat_never_500(client: httpx.Client, body: dict[str, Any]) -> None:
    check(client, "/v1/chat/completions", body)


def test_min_tokens_with_a_constraint_is_400_naming_it(client: httpx.Client) -> None:
    body = {
        "prompt": "a",
        "max_tokens": 4,
        "min_tokens": 2,
        "structured_outputs": {"choice": ["a"]},
    }
    r = client.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
