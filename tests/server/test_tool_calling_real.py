"""A vLLM user's tool loop against a real ``hybridkv serve --enable-auto-tool-choice
--tool-call-parser hermes --reasoning-parser qwen3`` (tiny random hybrid) with the openai client.
A random model calls no tool on its own, but ``required`` and named choices are held to the
tools' JSON schema by the structured-output backend, so they call tools on any model; the
second turn (an assistant message with ``content: null`` and ``tool_calls``, then a ``tool``
message) renders through the checkpoint's template, over HTTP and in ``LLM.chat``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server.harness import SubprocessServer

pytestmark = pytest.mark.slow

NAME = "tiny"
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]
ENGINE = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "4", "--seed", "0"]
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]  # fmt: skip
USER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [str(model_dir), "--served-model-name", NAME, *FLAGS, *ENGINE]
    with SubprocessServer(args, log) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: SubprocessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_call(call: Any) -> dict[str, Any]:
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    else:
        assert call.function.name == "get_time" and arguments in ({"zone": "UTC"}, {"zone": "CET"})
    return dict(arguments)


def test_tool_loop_required_then_answer(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=200, temperature=0)  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls or []) == 1
    for call in choice.message.tool_calls or []:
        check_call(call)
    results = [{"role": "tool", "tool_call_id": c.id, "content": "sunny"}
               for c in choice.message.tool_calls]  # fmt: skip
    turn = [*USER, choice.message.model_dump(exclude_none=True), *results]
    second = client.chat.completions.create(model=NAME, messages=turn, tools=TOOLS,
                                            tool_choice="none", max_tokens=4)  # fmt: skip
    assert second.choices[0].finish_reason == "length" and second.usage
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_named_choice_streams_its_arguments(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    stream = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                            tool_choice=named, max_tokens=60, stream=True,
                                            temperature=0)  # fmt: skip
    names, arguments = [], ""
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or []:
            if call.id:
                names.append(call.function.name)  # type: ignore[union-attr]
            arguments += call.function.arguments or ""  # type: ignore[union-attr]
    assert names == ["get_time"] and json.loads(arguments) in ({"zone": "UTC"}, {"zone": "CET"})


def test_prompt_logprobs_and_token_ids(client: openai.OpenAI) -> None:
    r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=2,
                                  extra_body={"prompt_logprobs": 2, "return_token_ids": True})  # fmt: skip
    choice: Any = r.choices[0].model_extra
    ids, entries = choice["prompt_token_ids"], choice["prompt_logprobs"]
    assert len(ids) == len(entries) == r.usage.prompt_tokens and entries[0] is None  # type: ignore[union-attr]
    for token_id, entry in zip(ids[1:], entries[1:], strict=True):
        assert str(token_id) in entry and 2 <= len(entry) <= 3
        assert all(v["logprob"] <= 0 and isinstance(v["rank"], int) for v in entry.values())
    assert len(choice["token_ids"]) == 2
    echo = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=0,
                                     echo=True, logprobs=1)  # fmt: skip
    scored = echo.choices[0].logprobs.token_logprobs  # type: ignore[union-attr]
    want = [None] + [e[str(t)]["logprob"] for t, e in zip(ids[1:], entries[1:], strict=True)]
    assert echo.choices[0].text == "Once upon a time" and scored == pytest.approx(want, abs=1e-4)


def test_llm_chat_renders_a_tool_loop(model_dir: Path) -> None:
    from hybridkv import LLM, SamplingParams
    from tests.support.lifetimes import track

    llm = track(LLM(str(model_dir), kv_cache_memory="64MiB", max_num_seqs=2))
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip
    out = llm.chat(messages, SamplingParams(max_tokens=2), tools=TOOLS, use_tqdm=False)
    assert out[0].prompt is not None and "sunny" in out[0].prompt
    assert len(out[0].outputs[0].token_ids) == 2
