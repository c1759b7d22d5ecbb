"""The OpenAI endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hybridkv.sampling.params import SamplingParams
from hybridkv.sampling.transfer_params import TransferFields, parse_transfer_params
from hybridkv.server.async_engine import EngineDead, Overloaded, Rejected, RequestStream
from hybridkv.server.errors import APIError, bad_request
from hybridkv.server.params import Prepared, prepare_chat, prepare_completion
from hybridkv.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from hybridkv.server.responses import (
    BaseFormat,
    ChatFormat,
    CompletionFormat,
    ResponseHeader,
    full_response,
)
from hybridkv.server.state import ServerState
from hybridkv.server.streaming import engine_error, stream_events, wait_for_all

router = APIRouter(prefix="/v1")
logger = logging.getLogger("hybridkv.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_AFTER_SECONDS = 1


@router.post("/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    async with _releasing(request, body):
        state = _checked(request, body)
        # off the event loop: tokenizing a long prompt must not hold up other requests
        prepared = await asyncio.to_thread(
            prepare_completion, body, state.tokenizer, state.prompt_limits, state.sampling_defaults
        )
    return await _serve(request, state, prepared, CompletionFormat(), body.model)


@router.post("/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    async with _releasing(request, body):
        state = _checked(request, body)
        prepared = await asyncio.to_thread(
            prepare_chat, body, state.tokenizer, state.prompt_limits, state.sampling_defaults,
            state.chat_parsers,
        )  # fmt: skip
    return await _serve(request, state, prepared, ChatFormat(prepared.answer.chat), body.model)


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [ServerState.of(request).model_card()]}


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    state = ServerState.of(request)
    state.check_model(model_id)
    return state.model_card()


@contextlib.asynccontextmanager
async def _releasing(request: Request, body: _SamplingFields) -> AsyncIterator[None]:
    """A request refused before it reaches the engine (a bad field, another model) may carry a
    producer's ``kv_transfer_params``: the engine tells that producer to free its KV now
    instead of after its lease (``EngineCore.release_transfer``; a refusal by the engine itself
    is handled there)."""
    try:
        yield
    except APIError:
        await _release(ServerState.of(request), _parsed(body.kv_transfer_params))
        raise


def _parsed(params: dict[str, Any] | None) -> TransferFields | None:
    """A refused request's params, typed (malformed ones name no producer to free)."""
    try:
        return parse_transfer_params(params) if params else None
    except ValueError:
        return None


async def _release(state: ServerState, fields: TransferFields | None) -> None:
    if fields is not None and fields.do_remote_prefill:
        with contextlib.suppress(Exception):  # the engine may be gone; the lease frees then
            await state.engine.call(lambda engine: engine.release_transfer(fields))


def _checked(request: Request, body: _SamplingFields) -> ServerState:
    """The server's state, once the model is ours; fields we do not know are logged (vLLM's
    behaviour: ignored, with a warning)."""
    state = ServerState.of(request)
    state.check_model(body.model)
    ignored = body.ignored_fields()
    if ignored:
        logger.warning("the request's fields %s are not used by this server: ignored", ignored)
    return state


async def _serve(
    request: Request, state: ServerState, prepared: Prepared, fmt: BaseFormat, model: str
) -> Response:
    request_id = f"{fmt.id_prefix}-{uuid.uuid4().hex}"
    streams: list[RequestStream] = []
    try:
        for i, p in enumerate(prepared.requests):
            rid = request_id if len(prepared.requests) == 1 else f"{request_id}-{i}"
            if state.log_requests:
                logger.info("received request %s: %d prompt tokens, %s", rid,
                            len(p.prompt_token_ids), _changed(p.params))  # fmt: skip
            streams.append(await state.engine.submit(p, rid))
    except Rejected as exc:
        _abort(state, streams)
        raise bad_request(str(exc), fmt.prompt_param) from None
    except Overloaded as exc:
        _abort(state, streams)
        await _release(state, prepared.requests[0].params.transfer_fields)
        state.metrics.on_refused("overloaded")
        raise APIError(
            503,
            str(exc),
            type="service_unavailable",
            code="overloaded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    except EngineDead as exc:
        raise engine_error(exc) from None
    except BaseException:
        _abort(state, streams)
        raise
    header = ResponseHeader(request_id, int(time.time()), model)
    if prepared.answer.stream:
        events = stream_events(state.engine, streams, fmt, header, prepared, state.tokenizer)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    outs = await wait_for_all(state.engine, streams, request)
    if outs is None:  # the client is gone; nobody reads this
        return Response(status_code=499)
    return JSONResponse(full_response(fmt, header, outs, prepared, state.tokenizer))


def _abort(state: ServerState, streams: list[RequestStream]) -> None:
    """A later prompt of the request was refused: the earlier ones must not run on."""
    for stream in streams:
        state.engine.abort(stream.request_id)


def _changed(params: SamplingParams) -> str:
    """The sampling parameters that differ from the defaults, for the request log."""
    default = SamplingParams()
    parts = [
        f"{f.name}={getattr(params, f.name)!r}"
        for f in dataclasses.fields(params)
        if f.init and getattr(params, f.name) != getattr(default, f.name)  # not derived ones
    ]
    return "SamplingParams(" + ", ".join(parts) + ")"
