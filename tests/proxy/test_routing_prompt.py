"""The prompt a decision hashes, read from the client's body at the boundary: ids given are
checked and bounded, text and chat go to the engine's /tokenize, and anything odd (hostile
ids, a bad salt, a /tokenize that fails or lies) means "route by load", never an error."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from hybridkv.proxy.routing.prompt import (
    MAX_PROMPT_TOKENS,
    Prompt,
    cache_salt_of,
    read_prompt,
    token_ids_of,
)


@pytest.mark.parametrize(
    "raw",
    [
        [],
        [1, -1],
        [1, True],
        [1, 2.0],
        [1, 1 << 40],
        ["a"],
        [[1]],
        "text",
        None,
        [0] * (MAX_PROMPT_TOKENS + 1),
    ],
)
def test_odd_token_ids_are_no_prompt(raw: Any) -> None:
    assert token_ids_of(raw) is None


@pytest.mark.parametrize("salt", [None, "", 5, ["x"], "x" * 5000])
def test_odd_salts_are_no_salt(salt: Any) -> None:
    assert cache_salt_of({"cache_salt": salt}) is None


def read(body: dict[str, Any], path: str, answer: httpx.Response | None) -> Prompt | None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if answer is None:
            raise httpx.ConnectError("down")
        return answer

    async def go() -> Prompt | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await read_prompt(client, "http://e", path, body, {}, 1.0)

    out = asyncio.run(go())
    if path.endswith("chat/completions") and seen:
        assert "stream" not in seen[0] and seen[0]["messages"] == body["messages"]
    return out


def test_ids_are_used_as_given_and_text_is_tokenized_by_the_engine() -> None:
    given = read({"prompt": [5, 6, 7], "cache_salt": "t"}, "/v1/completions", None)
    assert given == Prompt((5, 6, 7), "t")
    ok = httpx.Response(200, json={"tokens": [9, 8], "count": 2})
    assert read({"prompt": "hi"}, "/v1/completions", ok) == Prompt((9, 8), None)
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert read(chat, "/v1/chat/completions", ok) == Prompt((9, 8), None)


@pytest.mark.parametrize(
    "answer",
    [
        None,  # unreachable
        httpx.Response(400, json={"error": "bad"}),
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"tokens": [-3]}),
        httpx.Response(200, json={"tokens": "x"}),
    ],
)
def test_a_failing_or_lying_tokenize_means_route_by_load(answer: httpx.Response | None) -> None:
    assert read({"prompt": "hi"}, "/v1/completions", answer) is None


def test_a_batch_of_prompts_is_routed_by_load() -> None:
    assert read({"prompt": ["a", "b"]}, "/v1/completions", None) is None
