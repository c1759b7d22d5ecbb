"""What every engine call of one client request shares (``Call``), and the pieces of a call
the forwarding steps share: the first-byte wait (an engine found down stops it), the errors,
the OpenAI-shaped gateway error."""

from __future__ import annotations

import asyncio
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from hybridkv.proxy.options import EngineTimeouts, ProxyOptions
from hybridkv.proxy.router import Router
from hybridkv.proxy.routing.decision import Decision
from hybridkv.server.errors import APIError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """What every engine call of one client request shares."""

    client: httpx.AsyncClient
    router: Router
    options: ProxyOptions
    path: str  # /v1/completions or /v1/chat/completions
    headers: dict[str, str]  # Authorization for the engines
    decision: Decision | None = None  # the KV-aware order of decode engines (routing/)

    @property
    def post_headers(self) -> dict[str, str]:
        return {**self.headers, "content-type": "application/json"}

    @property
    def timeouts(self) -> EngineTimeouts:
        return self.options.timeouts


class TooLarge(Exception):
    """An engine's answer (or one event of it) is larger than ``MAX_ANSWER_BYTES``."""


class EngineDown(TimeoutError):
    """A /health probe found the engine unhealthy while a call to it waited."""


async def first_byte(call: Call, url: str, answer: Awaitable[T]) -> T:
    """``answer`` (an engine call up to its headers), raising ``TimeoutError`` past
    ``first_byte_seconds``, or ``EngineDown`` as soon as a /health probe finds the engine
    unhealthy (a hung engine does not hold its requests for the whole timeout). An engine
    already unhealthy when the call begins (tried last: no other answered) is not watched."""
    task = asyncio.ensure_future(answer)
    watched: set[asyncio.Future[Any]] = {task}
    if call.router.healthy[url]:
        watched.add(asyncio.ensure_future(call.router.wait_unhealthy(url)))
    try:
        done, _ = await asyncio.wait(
            watched, timeout=call.timeouts.first_byte_seconds, return_when=FIRST_COMPLETED
        )
    finally:
        for t in watched:
            t.cancel()  # a no-op on the done one
    if task in done:
        result = task.result()
        call.router.touch(url)  # it answered: alive (health.py tells slow from down by it)
        return result
    raise EngineDown("its /health probe failed") if done else TimeoutError()


async def send_streamed(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """``request`` sent and its answer's headers read; sent once more when the connection
    broke before any answer (a kept-alive one the engine was closing as it was reused: it
    never ran the request; a request is idempotent until its first token anyway)."""
    try:
        return await client.send(request, stream=True)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return await client.send(request, stream=True)


def gateway_error(status: int, message: str, type_: str = "server_error") -> APIError:
    return APIError(status, message, type=type_, code="upstream_failed")


def describe(exc: BaseException) -> str:
    if isinstance(exc, EngineDown):
        return f"the engine went down ({exc})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ValueError | RecursionError):
        return "its JSON answer does not parse (cut short?)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def type_of(r: httpx.Response) -> str:
    return str(r.headers.get("content-type", "application/json"))
