"""A request's prompt as the engines will see it: token ids and cache salt, read from the
client's body once, typed and bounded.

::

    /v1/completions       "prompt": [ids]  -> used as given
                          "prompt": "text" -> the engine's POST /tokenize {"prompt": text}
    /v1/chat/completions  the body         -> POST /tokenize (the engine renders the chat
                                              template exactly as its chat route does)

Anything else (a batch of prompts, a bad type, a refused /tokenize) gives None: the request is
routed by load alone, and the engine answers the client's mistake itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

MAX_PROMPT_TOKENS = 1 << 20
MAX_SALT_CHARS = 4096
MAX_TOKENIZE_ANSWER_BYTES = 64 << 20
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: tuple[int, ...]
    cache_salt: str | None


def cache_salt_of(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if isinstance(salt, str) and 0 < len(salt) <= MAX_SALT_CHARS:
        return salt
    return None


def token_ids_of(raw: Any) -> tuple[int, ...] | None:
    """A list of token ids, bounded; None for anything else."""
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_PROMPT_TOKENS:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 32 for t in raw):
        return None
    return tuple(raw)


async def read_prompt(
    client: httpx.AsyncClient,
    engine_url: str,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout: float,
) -> Prompt | None:
    """The prompt of ``body`` for the route ``path``, or None (route by load)."""
    salt = cache_salt_of(body)
    if path != CHAT_PATH:
        prompt = body.get("prompt")
        ids = token_ids_of(prompt)
        if ids is not None:
            return Prompt(ids, salt)
        if not isinstance(prompt, str):
            return None
        query: dict[str, Any] = {"prompt": prompt}
        if isinstance(body.get("model"), str):
            query["model"] = body["model"]
    else:
        query = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    ids = await _tokenize(client, engine_url, query, headers, timeout)
    return None if ids is None else Prompt(ids, salt)


async def _tokenize(
    client: httpx.AsyncClient,
    engine_url: str,
    query: dict[str, Any],
    headers: dict[str, str],
    timeout: float,
) -> tuple[int, ...] | None:
    try:
        call = client.post(engine_url + "/tokenize", json=query, headers=headers)
        answer = await asyncio.wait_for(call, timeout)
        if answer.status_code != 200 or len(answer.content) > MAX_TOKENIZE_ANSWER_BYTES:
            return None
        data = answer.json()
    except (httpx.HTTPError, TimeoutError, ValueError):
        return None
    return token_ids_of(data.get("tokens")) if isinstance(data, dict) else None
