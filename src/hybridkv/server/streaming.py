"""Answering one accepted request: server-sent events, or one JSON body at the end.

A client that goes away aborts its request, which frees its blocks: when streaming, Starlette
cancels the event generator (its ``finally`` aborts); otherwise a watcher on the connection
notices the disconnect while the request runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from hybridkv.engine.output import RequestOutput
from hybridkv.server.async_engine import AsyncEngine, EngineDead, RequestStream
from hybridkv.server.errors import APIError
from hybridkv.server.params import PreparedRequest
from hybridkv.server.responses import (
    BaseFormat,
    Detokenizer,
    ResponseHeader,
    chunk,
    finish_reason,
    token_logprobs,
    usage_chunk,
)


class DeltaTracker:
    """The part of a request's cumulative output not sent yet.

    Only text the engine's detokenizer calls stable (``stable_text_len``: it holds back what a
    stop string or a multi-byte character still arriving may change) is sent before the request
    finishes. Log-probabilities are sent as their tokens arrive."""

    def __init__(self) -> None:
        self.num_sent_chars = 0
        self.num_sent_tokens = 0

    def take_text(self, out: RequestOutput) -> str:
        text, stable = out.text, out.outputs[0].stable_text_len
        end = len(text) if out.finished or stable is None else stable
        if end <= self.num_sent_chars:
            return ""
        new = text[self.num_sent_chars : end]
        self.num_sent_chars = end
        return new

    def take_tokens(self, out: RequestOutput) -> tuple[int, int]:
        start, self.num_sent_tokens = self.num_sent_tokens, len(out.token_ids)
        return start, self.num_sent_tokens


def sse(data: dict[str, Any] | str) -> str:
    """One event; ``allow_nan=False``: a bare ``NaN`` is not JSON (the engine fails a request
    whose logits are not finite rather than send one)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, allow_nan=False)}\n\n"


async def stream_events(
    engine: AsyncEngine,
    stream: RequestStream,
    fmt: BaseFormat,
    header: ResponseHeader,
    prepared: PreparedRequest,
    tokenizer: Detokenizer,
) -> AsyncIterator[str]:
    """OpenAI's chunk stream, ending with ``data: [DONE]``; a failure mid-stream is sent as an
    ``{"error": ...}`` event before it."""
    tracker = DeltaTracker()
    first, last = True, None
    try:
        while not stream.finished:
            out = await stream.next_output()
            if out.error is not None:
                yield sse(request_failed(out.error).body())
                break
            text, (start, end) = tracker.take_text(out), tracker.take_tokens(out)
            if text or end > start or out.finished or first:
                lp = token_logprobs(out, start, end, tracker.num_sent_chars - len(text), tokenizer)
                choice = fmt.chunk_choice(text, lp, finish_reason(out), first)
                yield sse(chunk(fmt, header, choice, out.kv_transfer_params))
                first = False
            last = out
        if prepared.include_usage and last is not None:
            yield sse(usage_chunk(fmt, header, last))
    except EngineDead as exc:
        yield sse(engine_error(exc).body())
    finally:
        if not stream.finished:  # the client went away (or we failed): free its blocks
            engine.abort(stream.request_id)
    yield sse("[DONE]")


async def wait_for_final(
    engine: AsyncEngine, stream: RequestStream, request: Request
) -> RequestOutput | None:
    """The finished output, or None if the client disconnected first (the request is aborted)."""
    consumer = asyncio.ensure_future(_last_output(stream))
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        consumer.cancel()
        if not stream.finished:
            engine.abort(stream.request_id)
    if consumer not in done:
        return None
    try:
        out = consumer.result()
    except EngineDead as exc:
        raise engine_error(exc) from None
    if out.error is not None:
        raise request_failed(out.error)
    return out


def engine_error(exc: EngineDead) -> APIError:
    return APIError(503, str(exc), type="service_unavailable", code="engine_unavailable")


def request_failed(message: str) -> APIError:
    """The engine finished this request with an error (e.g. a KV load failed under policy
    ``fail``): a server-side failure of this request only."""
    return APIError(500, message, type="server_error", code="request_failed")


async def _last_output(stream: RequestStream) -> RequestOutput:
    out = await stream.next_output()
    while not stream.finished:
        out = await stream.next_output()
    return out


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
