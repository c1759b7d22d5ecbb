"""vLLM's response extensions over HTTP (fake engine): ``prompt_logprobs`` in vLLM's shape,
``echo`` with ``max_tokens: 0`` (lm-eval's scoring request) and ``return_token_ids``; and
vLLM's chat-message normalisation (the second turn of a tool loop renders)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hybridkv.model.loading.chat_template import ChatTemplateError, text_messages
from tests.server.harness import ThreadedServer
from tests.server.scripted_engine import MODEL, make_scripted_app

PROMPT = "abcd"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app, _ = make_scripted_app({"q?": "ok"})
    with ThreadedServer(app) as server:
        yield server.url


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json={"model": MODEL, **body}, timeout=30)


def events(r: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_prompt_logprobs_in_vllm_shape(url: str) -> None:
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 1})
    choice = r.json()["choices"][0]
    want = [None] + [{str(ord(c)): {"logprob": -1.0, "rank": 1, "decoded_token": c}}
                     for c in PROMPT[1:]]  # fmt: skip
    assert choice["prompt_logprobs"] == want and choice["text"] == "ef"
    chat = post(url, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "q?"}], "prompt_logprobs": 0})  # fmt: skip
    body = chat.json()
    prompt = "<user>q?<assistant>"  # the fake template
    assert len(body["prompt_logprobs"]) == len(prompt) and body["prompt_logprobs"][0] is None
    assert "prompt_logprobs" not in body["choices"][0]  # chat: beside the choices (vLLM's)
    plain = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}).json()
    assert "prompt_logprobs" not in plain["choices"][0]  # only when asked
    r = post(url, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt(url: str, stream: bool) -> None:
    body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "stream": stream}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [c for c in events(r) if c["choices"]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        lp = [t for c in chunks if c["choices"][0]["logprobs"]
              for t in c["choices"][0]["logprobs"]["token_logprobs"]]  # fmt: skip
    else:
        choice = r.json()["choices"][0]
        text, lp = choice["text"], choice["logprobs"]["token_logprobs"]
        assert r.json()["usage"]["completion_tokens"] == 0
    assert text == PROMPT and lp == [None, -1.0, -1.0, -1.0]  # the prompt only
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_return_token_ids(url: str) -> None:
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "return_token_ids": True})
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == [ord(c) for c in PROMPT]
    assert choice["token_ids"] == [ord(c) for c in "efg"]
    messages = [{"role": "user", "content": "q?"}]
    body = post(url, "/v1/chat/completions", {"messages": messages, "return_token_ids": True})
    prompt = "<user>q?<assistant>"
    assert body.json()["prompt_token_ids"] == [ord(c) for c in prompt]
    assert body.json()["choices"][0]["token_ids"] == [ord("o"), ord("k")]
    streamed = post(url, "/v1/chat/completions",
                    {"messages": messages, "return_token_ids": True, "stream": True})  # fmt: skip
    chunks = events(streamed)
    assert chunks[0]["prompt_token_ids"] == [ord(c) for c in prompt]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == [ord("o"), ord("k")]
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stream": True,
                                      "return_token_ids": True})  # fmt: skip
    chunks = events(r)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [ord(c) for c in PROMPT]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == [ord("e"), ord("f")]
    plain = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}).json()
    assert "token_ids" not in plain["choices"][0]


def test_messages_are_normalised_as_vllm() -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": '{"x": [1, 2]}'}}  # fmt: skip
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "x", "reasoning_content": "why",
         "tool_calls": [{"function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]  # fmt: skip
    out = text_messages(messages)
    assert out[0]["content"] == "" and out[0]["tool_calls"][0]["function"]["arguments"] == {
        "x": [1, 2]
    }
    assert out[0]["tool_calls"][0]["id"] == "c1"
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {}
    assert out[1]["reasoning"] == out[1]["reasoning_content"] == "why"
    assert out[2] == messages[2] and messages[0]["content"] is None  # the input is not changed
    for bad in ([{"function": {"name": "f", "arguments": "{x"}}], [{"function": {}}], "f"):
        with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.tool_calls"):
            text_messages([{"role": "assistant", "tool_calls": bad}])


def test_hostile_tool_call_arguments_are_refused_not_crashed() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # json.loads would recurse past Python's limit
    with pytest.raises(ChatTemplateError, match="not JSON"):
        text_messages([{"role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}])  # fmt: skip


def test_parsers_survive_hostile_model_output() -> None:
    from hybridkv.server.chat_output import ChatOutputPlan, ChatParsers
    from hybridkv.server.tools.choice import ToolChoice

    tools = ({"type": "function", "function": {"name": "f"}},)
    deep = '{"name": "f", "arguments": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001
    for parser in ("hermes", "granite", "llama3_json", "qwen3_xml"):
        plan = ChatOutputPlan(ToolChoice("auto"), ChatParsers(parser, True), tools, "")
        for text in (f"<tool_call>{deep}</tool_call>", "<tool_call>" * 1000, "\\" * 1000):
            message, called = plan.message(text)
            assert not called and message["content"] == text
