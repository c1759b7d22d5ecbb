"""The FastAPI app of one server: OpenAI routes, /health, /metrics, API-key check, errors."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from hybridkv.server.admin import RESET_PATH, reset_prefix_cache
from hybridkv.server.compat import add_compat_routes
from hybridkv.server.errors import APIError, install_error_handlers
from hybridkv.server.kv_info import INFO_PATH, kv_events_info
from hybridkv.server.limits import BodyLimit
from hybridkv.server.routes import router
from hybridkv.server.state import ServerState
from hybridkv.server.tokenize import DETOKENIZE_PATH, TOKENIZE_PATH, detokenize, tokenize


def create_app(state: ServerState, api_key: str | None = None) -> FastAPI:
    """The app; its lifespan starts and stops the engine thread. Bodies are bounded by
    ``state.limits`` before the API key check and the routes see them."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="hybridkv", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.hybridkv = state
    install_error_handlers(app)
    app.include_router(router)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/ping", _health, methods=["GET", "POST"])  # vLLM's (SageMaker's) name
    add_compat_routes(app)  # /version; clear refusals of /v1/embeddings, /v1/responses...
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route(RESET_PATH, reset_prefix_cache, methods=["POST"])
    app.add_api_route(TOKENIZE_PATH, tokenize, methods=["POST"])
    app.add_api_route(DETOKENIZE_PATH, detokenize, methods=["POST"])
    app.add_api_route(INFO_PATH, kv_events_info, methods=["GET"])  # for KV-aware routers
    limits = state.limits
    app.add_middleware(
        BodyLimit,
        max_bytes=limits.max_request_bytes,
        timeout=limits.body_timeout_seconds,
        on_refused=state.metrics.on_refused,
    )
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)  # outermost: no body read without a key
    return app


async def _health(request: Request) -> Response:
    """200 with ``{"status": "ok", "num_steps", "in_step", "step_seconds"}`` (steps finished,
    whether one runs now, how long the current iteration has run), or 503 if the engine
    thread is gone or has been in one step for longer than ``--engine-stall-seconds`` (a
    stuck step: every request would wait forever). Answered on the event loop while the
    engine thread computes (``tests/e2e_routing/test_busy_health.py``)."""
    state = ServerState.of(request)
    engine, limit = state.engine, state.limits.engine_stall_seconds
    if not engine.is_healthy:
        reason = engine.error or "the engine thread is not running"
        raise APIError(503, reason, type="service_unavailable", code="engine_unavailable")
    stalled = engine.stalled_seconds
    if stalled > limit:
        message = (
            f"the engine is stalled: its current step has run for {stalled:.1f} s "
            f"(--engine-stall-seconds={limit:g})"
        )
        raise APIError(503, message, type="service_unavailable", code="engine_stalled")
    num_steps, in_step = engine.num_steps, engine.in_step
    busy = {"num_steps": num_steps, "in_step": in_step, "step_seconds": round(stalled, 3)}
    return JSONResponse({"status": "ok", **busy})


async def _metrics(request: Request) -> Response:
    metrics = ServerState.of(request).metrics
    return Response(metrics.render(), media_type=metrics.content_type)


class BearerAuth:
    """Requires ``Authorization: Bearer <key>`` on /v1/*, the admin reset and (de)tokenize; /health and
    /metrics stay open (probes and scrapers), as in vLLM."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        guarded = path.startswith("/v1") or path in (
            RESET_PATH,
            TOKENIZE_PATH,
            DETOKENIZE_PATH,
            INFO_PATH,
        )
        if not guarded or self._ok(scope):
            await self.app(scope, receive, send)
            return
        error = APIError(
            401,
            "invalid or missing API key: send 'Authorization: Bearer <key>'",
            type="authentication_error",
            code="invalid_api_key",
        )
        await error.response()(scope, receive, send)

    def _ok(self, scope: Scope) -> bool:
        headers: dict[bytes, Any] = dict(scope["headers"])
        return hmac.compare_digest(headers.get(b"authorization", b""), self._expected)
