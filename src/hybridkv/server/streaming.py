"""Answering one accepted request: server-sent events, or one JSON body at the end.

A client that goes away aborts its request, which frees its blocks: when streaming, Starlette
cancels the event generator (its ``finally`` aborts); otherwise a watcher on the connection
notices the disconnect while the request runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.server.async_engine import AsyncEngine, EngineDead, RequestStream
from hybridkv.server.errors import APIError
from hybridkv.server.params import Prepared
from hybridkv.server.responses import (
    BaseFormat,
    Detokenizer,
    ResponseHeader,
    chunk,
    echo_prefix,
    finish_reason,
    join_logprobs,
    output_logprobs,
    prompt_logprobs,
    usage_chunk,
)


class DeltaTracker:
    """The part of one choice's cumulative output not sent yet.

    Only text the engine's detokenizer calls stable (``stable_text_len``: it holds back what a
    stop string or a multi-byte character still arriving may change) is sent before the request
    finishes. Log-probabilities are sent as their tokens arrive."""

    def __init__(self) -> None:
        self.num_sent_chars = 0
        self.num_sent_tokens = 0
        self.first = True

    def take_text(self, c: CompletionOutput, finished: bool) -> str:
        text, stable = c.text, c.stable_text_len
        end = len(text) if finished or stable is None else stable
        if end <= self.num_sent_chars:
            return ""
        new = text[self.num_sent_chars : end]
        self.num_sent_chars = end
        return new

    def take_tokens(self, c: CompletionOutput) -> tuple[int, int]:
        start, self.num_sent_tokens = self.num_sent_tokens, len(c.token_ids)
        return start, self.num_sent_tokens


def sse(data: dict[str, Any] | str) -> str:
    """One event; ``allow_nan=False``: a bare ``NaN`` is not JSON (the engine fails a request
    whose logits are not finite rather than send one)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, allow_nan=False)}\n\n"


@dataclass(slots=True)
class _Choices:
    """What the stream has sent: one tracker per (prompt, choice)."""

    fmt: BaseFormat
    header: ResponseHeader
    prepared: Prepared
    tokenizer: Detokenizer
    trackers: dict[tuple[int, int], DeltaTracker] = field(default_factory=dict)

    def chunks(self, i: int, out: RequestOutput) -> Iterator[dict[str, Any]]:
        """The chunks ``out`` (prompt ``i``'s newest output) adds, one per changed choice."""
        answer = self.prepared.answer
        for c in out.outputs:
            tracker = self.trackers.setdefault((i, c.index), DeltaTracker())
            text, (start, end) = tracker.take_text(c, out.finished), tracker.take_tokens(c)
            if answer.echo_only:  # the one token made is not shown
                text, start, end = "", 0, 0
            reason = finish_reason(out, c)
            if not (text or end > start or reason or tracker.first):
                continue
            prefix = echo_prefix(self.prepared, i)
            offset = len(prefix) + tracker.num_sent_chars - len(text)
            lp = output_logprobs(c, start, end, offset, answer, self.tokenizer)
            if tracker.first and answer.echo:
                text = prefix + text
                lp = join_logprobs(prompt_logprobs(out, answer, self.tokenizer), lp)
            index = i * answer.n + c.index
            choice = self.fmt.chunk_choice(index, text, lp, reason, tracker.first)
            yield self._with_token_ids(choice, out, c.token_ids[start:end], tracker.first)
            tracker.first = False

    def _with_token_ids(
        self, choice: dict[str, Any], out: RequestOutput, ids: Any, first: bool
    ) -> dict[str, Any]:
        """The chunk, with vLLM's ``token_ids`` (this chunk's) and, first, the prompt's."""
        body = chunk(self.fmt, self.header, choice, out.kv_transfer_params)
        if first and out.kv_events_seq is not None:  # the prefill's events (docs/kv_events.md)
            body["kv_events_seq"] = out.kv_events_seq
        if not self.prepared.answer.return_token_ids:
            return body
        choice["token_ids"] = list(ids)
        if first:
            where = choice if self.fmt.prompt_fields_on_choice else body
            where["prompt_token_ids"] = list(out.prompt_token_ids)
        return body


async def stream_events(
    engine: AsyncEngine,
    streams: list[RequestStream],
    fmt: BaseFormat,
    header: ResponseHeader,
    prepared: Prepared,
    tokenizer: Detokenizer,
) -> AsyncIterator[str]:
    """OpenAI's chunk stream over every prompt's request, ending with ``data: [DONE]``; a
    failure mid-stream is sent as an ``{"error": ...}`` event before it."""
    choices = _Choices(fmt, header, prepared, tokenizer)
    last: dict[int, RequestOutput] = {}
    mailbox = _Mailbox()
    pumps = [asyncio.ensure_future(_pump(i, s, mailbox)) for i, s in enumerate(streams)]
    failure: dict[str, Any] | None = None
    try:
        while failure is None and (
            len(last) < len(streams) or not all(o.finished for o in last.values())
        ):
            for i, item in await mailbox.take():
                if isinstance(item, EngineDead):
                    failure = engine_error(item).body()
                elif item.error is not None:
                    failure = request_failed(item.error, item.client_error).body()
                if failure is not None:
                    break
                assert isinstance(item, RequestOutput)
                last[i] = item
                for body in choices.chunks(i, item):
                    yield sse(body)
        if failure is not None:
            yield sse(failure)
        elif prepared.answer.include_usage:
            outs = [last[i] for i in sorted(last)]
            yield sse(usage_chunk(fmt, header, outs, prepared.answer))
    finally:
        for pump in pumps:
            pump.cancel()
        for stream in streams:
            if not stream.finished:  # the client went away (or we failed): free its blocks
                engine.abort(stream.request_id)
    yield sse("[DONE]")


class _Mailbox:
    """Each prompt's newest output (outputs are cumulative: a newer one replaces an unread
    older one, so a slow client costs no memory per step)."""

    def __init__(self) -> None:
        self._items: dict[int, RequestOutput | EngineDead] = {}
        self._ready = asyncio.Event()

    def put(self, i: int, item: RequestOutput | EngineDead) -> None:
        self._items[i] = item
        self._ready.set()

    async def take(self) -> list[tuple[int, RequestOutput | EngineDead]]:
        await self._ready.wait()
        self._ready.clear()
        items = sorted(self._items.items(), key=lambda kv: kv[0])
        self._items.clear()
        return items


async def _pump(i: int, stream: RequestStream, mailbox: _Mailbox) -> None:
    """Forward one request's outputs (tagged with its prompt's index) to the mailbox."""
    try:
        while not stream.finished:
            mailbox.put(i, await stream.next_output())
    except EngineDead as exc:
        mailbox.put(i, exc)


async def wait_for_all(
    engine: AsyncEngine, streams: list[RequestStream], request: Request
) -> list[RequestOutput] | None:
    """Every prompt's finished output, or None if the client disconnected first."""
    outs = []
    for stream in streams:
        out = await wait_for_final(engine, stream, request)
        if out is None:
            for other in streams:
                if not other.finished:
                    engine.abort(other.request_id)
            return None
        outs.append(out)
    return outs


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
        raise request_failed(out.error, out.client_error)
    return out


def engine_error(exc: EngineDead) -> APIError:
    return APIError(503, str(exc), type="service_unavailable", code="engine_unavailable")


def request_failed(message: str, client: bool = False) -> APIError:
    """The engine finished this request with an error: its own options left nothing to sample
    (``client``: a 400 the client must not retry), else a server-side failure of this request
    only (e.g. a KV load failed under policy ``fail``)."""
    if client:
        return APIError(400, message, type="invalid_request_error", code="invalid_request")
    return APIError(500, message, type="server_error", code="request_failed")


async def _last_output(stream: RequestStream) -> RequestOutput:
    out = await stream.next_output()
    while not stream.finished:
        out = await stream.next_output()
    return out


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
