"""One client request's calls to the engines: the prefill call, then the decode call whose
answer goes back to the client.

Every call is bounded in time (``EngineTimeouts``: connect, first byte, idle between chunks).
What the client sees when an engine fails:

| failure                                      | answer                                      |
|----------------------------------------------|---------------------------------------------|
| prefill engine refuses the request (4xx)     | its own answer, status and body             |
| prefill engine unreachable, 5xx, timed out,  | the next one; none left: decode colocated   |
| or found down (/health) while awaited        |                                             |
| decode engine unreachable, or found down     | the next one; none left: 503                |
| (/health) while its answer is awaited, or    |                                             |
| its stream fails before its first token      |                                             |
| decode engine's connection breaks before its | the next one, once (nothing reached the      |
| answer is whole (not streamed; a cut JSON    | client); then 502 naming the engines         |
| body too)                                    |                                             |
| decode engine times out before its answer is | 504 naming the engine, OpenAI's error shape  |
| whole, or sends one too large                | (502)                                        |
| decode engine fails mid-stream               | an ``{"error": ...}`` event, ``[DONE]``     |
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from hybridkv.proxy.calls import (
    Call,
    EngineDown,
    TooLarge,
    describe,
    first_byte,
    gateway_error,
    send_streamed,
    type_of,
)
from hybridkv.proxy.options import MAX_ANSWER_BYTES, EngineTimeouts
from hybridkv.proxy.router import Outcome, Router
from hybridkv.proxy.routing.decision import Decision

log = logging.getLogger(__name__)

T = TypeVar("T")
DONE_EVENT = b"data: [DONE]\n\n"
MAX_BODY_RETRIES = 1  # a non-streamed answer cut by its engine: tries on another engine
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Refused(Exception):
    """The prefill engine refused the request; ``response`` is its answer, for the client."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def prefill(call: Call, body: dict[str, Any]) -> dict[str, Any] | None:
    """The prefill engine's ``kv_transfer_params``, or None if no prefill engine could give
    them (the decode engine then computes the prompt). Raises ``Refused`` when one refuses the
    request: its body must not reach a decode engine."""
    payload = _encode(prefill_body(body))
    for url in call.router.prefill_order():
        try:
            post = call.client.post(url + call.path, content=payload, headers=call.post_headers)
            r = await first_byte(call, url, post)
        except (httpx.HTTPError, TimeoutError) as exc:
            log.warning("prefill engine %s failed: %s", url, describe(exc))
        else:
            if 400 <= r.status_code < 500:
                raise Refused(Response(r.content, r.status_code, media_type=type_of(r)))
            if r.status_code == 200:
                return _params_of(r, url)
            log.warning("prefill engine %s answered %d", url, r.status_code)
        call.router.count_failure(url, prefill=True)
    return None


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's body as a prefill request: one token, one copy, not streamed, params
    asked for. ``min_tokens`` goes (above 1 it would make an honest request fail there);
    ``n`` and ``best_of`` go (the copies share the one transfer on the decode engine)."""
    out = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    for name in ("stream_options", "min_tokens", "n", "best_of"):
        out.pop(name, None)
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


async def decode(call: Call, body: dict[str, Any], outcome: Outcome) -> Response:
    """The decode engine's answer: a stream relayed event by event, or a whole body."""
    payload = _encode(body)
    decision = call.decision
    cut: list[str] = []  # engines whose non-streamed answer broke off, and the last why
    why: Exception = ConnectionError()
    for url in call.router.decode_order() if decision is None else decision.order:
        request = call.client.build_request(
            "POST", url + call.path, content=payload, headers=call.post_headers
        )
        try:
            upstream = await first_byte(call, url, send_streamed(call.client, request))
        except (httpx.ConnectError, httpx.ConnectTimeout, EngineDown) as exc:
            log.warning("decode engine %s unreachable: %s", url, describe(exc))
            call.router.count_failure(url, prefill=False)
            continue
        except (httpx.HTTPError, TimeoutError) as exc:
            call.router.count_failure(url, prefill=False)
            return _failed(call, url, exc)
        if decision is not None:
            decision.dispatched(url)
        if upstream.status_code == 200 and type_of(upstream).startswith("text/event-stream"):
            streamed = await _stream_answer(call, url, upstream, outcome)
            if streamed is None:  # died before its first token: nothing reached the client
                continue
            return streamed
        whole = await _whole_answer(call, url, upstream)
        if isinstance(whole, Response):
            call.router.count(outcome)
            return whole
        cut.append(url)
        why = whole
        call.router.count_failure(url, prefill=False)
        if not _can_retry(whole) or len(cut) > MAX_BODY_RETRIES:
            return _failed(call, ", ".join(cut), whole)
        log.warning("decode engine %s broke off its answer (%s): retried", url, describe(whole))
    if decision is not None:
        decision.release()
    if cut:  # nothing answered after the cut one
        return _failed(call, ", ".join(cut), why)
    call.router.count(Outcome.FAILED)
    return gateway_error(503, "no decode engine answered", "service_unavailable").response()


async def _stream_answer(
    call: Call, url: str, upstream: httpx.Response, outcome: Outcome
) -> Response | None:
    """The engine's stream once its first bytes came (its first token: the request is
    idempotent until then); None when it failed before them (the caller tries the next)."""
    chunks = upstream.aiter_bytes()
    try:
        head = await first_byte(call, url, anext(chunks, b""))
    except (httpx.HTTPError, TimeoutError) as exc:
        head, why = b"", describe(exc)
    else:
        why = "the stream ended before its first event"
    if not head:
        await upstream.aclose()
        log.warning("decode engine %s failed before its first token: %s", url, why)
        call.router.count_failure(url, prefill=False)
        return None
    call.router.count(outcome)
    decision = call.decision
    cut = head.rfind(b"\n\n")
    seen = head[: cut + 2] if cut >= 0 else b""  # its whole events (the relay sees the rest)
    if decision is not None and seen:  # before the handler returns and its reservation
        decision.saw(seen)  # goes: its first chunk's seq
    on_failure = _failure_counter(call.router, url)
    chained = _chain(head, chunks, lambda: call.router.touch(url))
    events = relay_events(upstream, call.timeouts, on_failure, decision, chained, len(seen))
    # released after the stream, also when the client left before it began
    done = BackgroundTask(decision.release) if decision is not None else None
    return StreamingResponse(
        events, media_type="text/event-stream", headers=SSE_HEADERS, background=done
    )


async def _chain(
    head: bytes, rest: AsyncIterator[bytes], touch: Callable[[], None]
) -> AsyncIterator[bytes]:
    yield head
    async for chunk in rest:
        touch()  # the engine is alive (health.py: slow, not down)
        yield chunk


async def relay_events(
    upstream: httpx.Response,
    timeouts: EngineTimeouts,
    on_failure: Callable[[str], None],
    decision: Decision | None = None,
    chunks: AsyncIterator[bytes] | None = None,
    seen: int = 0,
) -> AsyncIterator[bytes]:
    """The engine's events, each sent whole. A stream that fails (the engine died, a chunk
    came too late, or it ended without ``[DONE]``) ends with an error event and ``[DONE]``,
    as the engine's own server ends a failed stream, never cut short. The decision sees
    every event once: not the first ``seen`` bytes (whole events it saw already)."""
    buf, done, failure = bytearray(), False, "the stream ended without [DONE]"
    chunks = upstream.aiter_bytes() if chunks is None else chunks
    wait = timeouts.first_byte_seconds
    try:
        while not done:
            chunk = await asyncio.wait_for(anext(chunks, b""), wait)
            if not chunk:
                break
            wait = timeouts.idle_seconds
            buf += chunk
            cut = buf.rfind(b"\n\n", max(0, len(buf) - len(chunk) - 1))
            if cut >= 0:
                events = bytes(buf[: cut + 2])
                del buf[: cut + 2]
                done = events.endswith(DONE_EVENT)
                if decision is not None and len(events) > seen:
                    decision.saw(events[seen:])
                seen = max(0, seen - len(events))
                yield events
            if len(buf) > MAX_ANSWER_BYTES:
                failure = f"an event larger than {MAX_ANSWER_BYTES} bytes"
                break
    except (httpx.HTTPError, TimeoutError) as exc:
        failure = describe(exc)
    finally:
        await upstream.aclose()
        if decision is not None:
            decision.release()
    if not done:
        on_failure(failure)
        error = gateway_error(502, f"the decode engine failed mid-stream: {failure}")
        yield b"data: " + json.dumps(error.body()).encode() + b"\n\n" + DONE_EVENT


async def _whole_answer(call: Call, url: str, upstream: httpx.Response) -> Response | Exception:
    """A non-streamed answer, read whole (nothing reaches the client before), or why it is
    not: the connection broke, the engine went quiet, the answer is too large, or a JSON
    answer does not parse (a body cut where its length was not announced)."""
    body = bytearray()
    try:
        chunks = upstream.aiter_bytes()
        while chunk := await asyncio.wait_for(anext(chunks, b""), call.timeouts.idle_seconds):
            call.router.touch(url)
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise TooLarge(f"an answer larger than {MAX_ANSWER_BYTES} bytes")
        if type_of(upstream).startswith("application/json"):
            json.loads(body)
    except (httpx.HTTPError, TimeoutError, TooLarge, ValueError, RecursionError) as exc:
        return exc
    finally:
        await upstream.aclose()
        if call.decision is not None:
            call.decision.saw(bytes(body[-(1 << 20) :]))
            call.decision.release()
    return Response(bytes(body), upstream.status_code, media_type=type_of(upstream))


def _can_retry(exc: Exception) -> bool:
    """A broken connection or a cut body: another engine may answer. Not a timeout (the
    client has waited already) nor a too-large answer (another engine's would be too)."""
    timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException)
    return not timed_out and not isinstance(exc, TooLarge)


def _failed(call: Call, url: str, exc: BaseException) -> Response:
    """The decode engine ``url`` (or engines) failed before its answer was whole: 504 for a
    timeout, else 502, naming it."""
    log.warning("decode engine %s failed: %s", url, describe(exc))
    call.router.count(Outcome.FAILED)
    timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException)
    message = f"decode engine {url} failed before its answer was complete: {describe(exc)}"
    return gateway_error(504 if timed_out else 502, message).response()


def _failure_counter(router: Router, url: str) -> Callable[[str], None]:
    def on_failure(reason: str) -> None:
        log.warning("decode engine %s failed mid-stream: %s", url, reason)
        router.count_failure(url, prefill=False)

    return on_failure


def _params_of(r: httpx.Response, url: str) -> dict[str, Any] | None:
    try:
        params = r.json().get("kv_transfer_params")
    except (ValueError, AttributeError):
        params = None
    if not isinstance(params, dict):
        log.warning("prefill engine %s gave no kv_transfer_params (is it a kv_producer?)", url)
        return None
    return params


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=False).encode()
