"""Tool calling, reasoning and vLLM's response extensions over HTTP, through the official openai
client, against a server whose fake engine answers scripted text (``scripted_engine.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hybridkv.server.chat_output import ChatParsers
from tests.server.harness import ThreadedServer
from tests.server.scripted_engine import MODEL, ScriptedEngine, make_scripted_app

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCRIPT = {
    "weather in Paris": CALL,
    "sunny, 21C": "It is sunny in Paris.",
    "think first": "<think>2 and 2</think>It is 4.",
    "REQUIRED": '[{"name": "get_weather", "parameters": {"city": "Rome"}}]',
    "NAMED": '{"city": "Oslo"}',
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ScriptedEngine]]:
    app, fake = make_scripted_app(SCRIPT, ChatParsers("hermes", True, "qwen3"))
    with ThreadedServer(app) as server:
        yield server.url, fake


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    """A server started without --enable-auto-tool-choice."""
    app, _ = make_scripted_app(SCRIPT)
    with ThreadedServer(app) as server:
        yield server.url


@pytest.fixture
def client(served: tuple[str, ScriptedEngine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json={"model": MODEL, **body}, timeout=30)


def test_tool_loop_with_the_openai_client(
    client: openai.OpenAI, served: tuple[str, ScriptedEngine]
) -> None:
    first = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris"
    }
    assert served[1].params[-1].skip_special_tokens is False  # hermes keeps its tags
    reply = choice.message.model_dump(exclude_none=True)  # content None, arguments a string
    tool = {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}
    second = client.chat.completions.create(model=MODEL, messages=[*USER, reply, tool],  # type: ignore[list-item]
                                            tools=[WEATHER])  # type: ignore[list-item]  # fmt: skip
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls


def test_tool_calls_stream_in_openai_shape(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                            stream=True)  # fmt: skip
    name, arguments, reasons, ids = None, "", [], set()
    for chunk in stream:
        delta = chunk.choices[0].delta
        assert not delta.content
        for call in delta.tool_calls or []:
            assert call.index == 0
            if call.id:
                ids.add(call.id)
                name = call.function.name  # type: ignore[union-attr]
            arguments += call.function.arguments or ""  # type: ignore[union-attr]
        reasons.append(chunk.choices[0].finish_reason)
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    assert len(ids) == 1 and reasons[-1] == "tool_calls"


def test_reasoning_is_split_whole_and_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "think first"}]
    r = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    extra = r.choices[0].message.model_extra or {}
    assert r.choices[0].message.content == "It is 4."
    assert extra["reasoning_content"] == extra["reasoning"] == "2 and 2"
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True):  # type: ignore[arg-type]
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (reasoning, content) == ("2 and 2", "It is 4.")


def test_required_and_named_are_constrained(
    client: openai.OpenAI, served: tuple[str, ScriptedEngine]
) -> None:
    user = [{"role": "user", "content": "REQUIRED"}]
    r = client.chat.completions.create(model=MODEL, messages=user, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                       tool_choice="required")  # fmt: skip
    schema = served[1].params[-1].structured_outputs.json  # type: ignore[union-attr]
    assert isinstance(schema, dict) and schema["type"] == "array" and schema["minItems"] == 1
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Rome"
    }
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == ""
    named = {"type": "function", "function": {"name": "get_weather"}}
    user = [{"role": "user", "content": "NAMED"}]
    r = client.chat.completions.create(model=MODEL, messages=user, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                       tool_choice=named)  # type: ignore[arg-type]  # fmt: skip
    assert served[1].params[-1].structured_outputs.json == WEATHER["function"]["parameters"]  # type: ignore[union-attr, index]
    (call,) = r.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')
    assert r.choices[0].finish_reason == "stop"


BAD_TOOL_REQUESTS = [
    ({"tool_choice": "auto"}, "tool_choice", "`tools` must be set"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "Invalid value"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "Correct usage"),
    ({"tools": [WEATHER], "tool_choice": {"function": {"name": "nope"}}}, "tool_choice",
     "does not match"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "cannot be combined"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "function"),
    ({"tools": [WEATHER], "messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{not json"}}]}]}, "messages", "not JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param", "words"), BAD_TOOL_REQUESTS)
def test_bad_tool_requests_are_400_naming_the_field(
    served: tuple[str, ScriptedEngine], extra: dict[str, Any], param: str, words: str
) -> None:
    r = post(served[0], "/v1/chat/completions", {"messages": USER, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_without_the_flags_tools_need_tool_choice_none(plain_url: str) -> None:
    r = post(plain_url, "/v1/chat/completions", {"messages": USER, "tools": [WEATHER]})
    assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"]
    r = post(plain_url, "/v1/chat/completions",
             {"messages": USER, "tools": [WEATHER], "tool_choice": "none"})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == CALL
    r = post(plain_url, "/v1/chat/completions",  # required works without a parser, as vLLM
             {"messages": [{"role": "user", "content": "REQUIRED"}], "tools": [WEATHER],
              "tool_choice": "required"})  # fmt: skip
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
