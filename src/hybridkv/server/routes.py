"""The OpenAI endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hybridkv.server.async_engine import EngineDead, Overloaded, Rejected
from hybridkv.server.errors import APIError, bad_request
from hybridkv.server.params import PreparedRequest, prepare_chat, prepare_completion
from hybridkv.server.protocol import ChatCompletionRequest, CompletionRequest
from hybridkv.server.responses import (
    BaseFormat,
    ChatFormat,
    CompletionFormat,
    ResponseHeader,
    full_response,
)
from hybridkv.server.state import ServerState
from hybridkv.server.streaming import engine_error, stream_events, wait_for_final

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_AFTER_SECONDS = 1


@router.post("/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = ServerState.of(request)
    state.check_model(body.model)
    # off the event loop: tokenizing a long prompt must not hold up other requests
    prepared = await asyncio.to_thread(
        prepare_completion, body, state.tokenizer, state.prompt_limits
    )
    return await _serve(request, state, prepared, CompletionFormat(), body.model)


@router.post("/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = ServerState.of(request)
    state.check_model(body.model)
    prepared = await asyncio.to_thread(prepare_chat, body, state.tokenizer, state.prompt_limits)
    return await _serve(request, state, prepared, ChatFormat(), body.model)


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [ServerState.of(request).model_card()]}


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    state = ServerState.of(request)
    state.check_model(model_id)
    return state.model_card()


async def _serve(
    request: Request, state: ServerState, prepared: PreparedRequest, fmt: BaseFormat, model: str
) -> Response:
    request_id = f"{fmt.id_prefix}-{uuid.uuid4().hex}"
    try:
        stream = await state.engine.submit(prepared, request_id)
    except Rejected as exc:
        raise bad_request(str(exc), fmt.prompt_param) from None
    except Overloaded as exc:
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
    header = ResponseHeader(request_id, int(time.time()), model)
    if prepared.stream:
        events = stream_events(state.engine, stream, fmt, header, prepared, state.tokenizer)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    out = await wait_for_final(state.engine, stream, request)
    if out is None:  # the client is gone; nobody reads this
        return Response(status_code=499)
    return JSONResponse(full_response(fmt, header, out, state.tokenizer))
