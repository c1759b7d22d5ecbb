"""The proxy's routes. Per request: the prefill engine computes the prompt (``max_tokens=1``,
``kv_transfer_params={"do_remote_decode": true}``); its answer's ``kv_transfer_params`` go with
the client's request to a decode engine, whose answer goes back (streamed event by event, or
whole). A prefill engine that fails is retried on the next; when all fail (or none is healthy),
the decode engine serves the request colocated (no params). A prefill engine that refuses the
request (4xx) answers the client itself: that body never reaches a decode engine.

The client's body is bounded (``BodyLimit``: 413 past ``--max-request-bytes``, read as it
arrives), parsed once (400 in OpenAI's shape for bad JSON, a non-object, ``NaN``/``Infinity``
or numbers beyond a float), and loses the client's own ``kv_transfer_params`` unless
``allow_client_kv_transfer_params`` (then they go to the decode engine as given, no prefill).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hybridkv.proxy.calls import Call
from hybridkv.proxy.forward import Refused, decode, prefill
from hybridkv.proxy.health import HealthMonitor
from hybridkv.proxy.metrics import render_metrics
from hybridkv.proxy.options import ENGINE_KEEPALIVE_SECONDS, ProxyOptions
from hybridkv.proxy.router import Outcome, Router
from hybridkv.proxy.routing.service import KVRouting
from hybridkv.server.app import BearerAuth
from hybridkv.server.errors import APIError, bad_request, install_error_handlers
from hybridkv.server.limits import BodyLimit

LARGE_BODY_BYTES = 1 << 20  # parsed on a worker thread from this size
PREDICT_PATH = "/v1/routing/predict"  # under /v1: behind the proxy's API key
PREDICTIONS_PATH = "/v1/routing/predictions"  # recent answered decisions (docs/routing.md)


def create_proxy_app(router: Router, options: ProxyOptions | None = None) -> FastAPI:
    options = options or ProxyOptions()
    connect = options.timeouts.connect_seconds
    # a kept-alive connection is reused for less than an engine keeps it (uvicorn: 5 s): a
    # request sent on one the engine is closing fails without an answer
    keep_alive = httpx.Limits(keepalive_expiry=ENGINE_KEEPALIVE_SECONDS)
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect), limits=keep_alive)
    fresh = httpx.Limits(max_keepalive_connections=0)  # probes: a new connection each
    probes = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect), limits=fresh)
    monitor = HealthMonitor(router, probes, options.timeouts)
    kv = KVRouting(router.decode, options.routing)
    monitor.on_change = kv.on_health
    background = [monitor.run(), kv.run(probes, options.engine_headers(None))]
    lifespan = _lifespan(background, client, probes)
    app = FastAPI(title="hybridkv proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.kv_routing = kv
    install_error_handlers(app)
    _add_generate_routes(app, client, router, options, kv)
    _add_info_routes(app, client, router, options, monitor, kv)
    limits = options.limits
    app.add_middleware(
        BodyLimit, max_bytes=limits.max_request_bytes, timeout=limits.body_timeout_seconds
    )
    if options.api_key:
        app.add_middleware(BearerAuth, api_key=options.api_key)  # outermost
    return app


def _lifespan(
    background: list[Coroutine[Any, Any, None]],
    client: httpx.AsyncClient,
    probes: httpx.AsyncClient,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The health monitor and the KV routing's subscribers run while the app serves; both
    HTTP pools close with them."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(work) for work in background]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.aclose()
            await probes.aclose()

    return lifespan


def _add_generate_routes(
    app: FastAPI, client: httpx.AsyncClient, router: Router, options: ProxyOptions, kv: KVRouting
) -> None:
    async def generate(path: str, request: Request) -> Response:
        body = await client_body(request)
        headers = options.engine_headers(_auth(request))
        turn = router.decode_order()
        decision = await kv.decide(client, path, body, headers, turn, router.healthy)
        call = Call(client, router, options, path, headers, decision)
        try:
            return await until_disconnect(request, route(call, body, kv))
        finally:
            decision.unreserve()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate("/v1/chat/completions", request)


def _add_info_routes(
    app: FastAPI,
    client: httpx.AsyncClient,
    router: Router,
    options: ProxyOptions,
    monitor: HealthMonitor,
    kv: KVRouting,
) -> None:
    @app.get("/health")
    async def health() -> Response:
        """200 while at least one prefill engine (if any is configured) and one decode engine
        answer their /health within ``--health-timeout``; else 503 saying which side is down."""
        await monitor.probe_all()
        problem = monitor.problem()
        if problem is not None:
            raise APIError(503, problem, type="service_unavailable", code="engine_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        headers = options.engine_headers(_auth(request))
        return JSONResponse(await _models(client, router, options, headers))

    @app.post(PREDICT_PATH)
    async def predict(request: Request) -> Response:
        """What the router would do with this body, without sending it (docs/routing.md)."""
        body = await client_body(request)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        headers = options.engine_headers(_auth(request))
        turn = router.decode_order()
        decision = await kv.decide(client, path, body, headers, turn, router.healthy, False)
        return JSONResponse(decision.describe())

    @app.get(PREDICTIONS_PATH)
    async def predictions() -> Response:
        """The recent answered decisions, oldest first: engine, predicted, expected and actual
        cached tokens, result, reason."""
        return JSONResponse({"predictions": list(kv.recent)})

    @app.get("/metrics")
    async def metrics() -> Response:
        page = render_metrics(router, kv, monitor.probes)
        return Response(page, media_type="text/plain; version=0.0.4")


async def route(call: Call, body: dict[str, Any], kv: KVRouting | None = None) -> Response:
    """Prefill (unless the client's own params are allowed and given, or the chosen decode
    engine already holds the prompt), then decode."""
    given = body.pop("kv_transfer_params", None)
    if given is not None and call.options.allow_client_kv_transfer_params:
        return await decode(call, {**body, "kv_transfer_params": given}, Outcome.DISAGGREGATED)
    decision = call.decision
    if call.router.prefill and kv is not None and decision and kv.can_skip_prefill(decision):
        return await decode(call, body, Outcome.PREFILL_SKIPPED)
    try:
        params = await prefill(call, body)
    except Refused as refused:
        call.router.count(Outcome.REFUSED)
        return refused.response
    if params is None:
        return await decode(call, body, Outcome.COLOCATED)
    return await decode(call, {**body, "kv_transfer_params": params}, Outcome.DISAGGREGATED)


async def until_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """``work``'s answer; if the client goes away first, ``work`` is cancelled (its engine
    calls are closed, so the engines abort their requests) and nobody reads the 499."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task in done else Response(status_code=499)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def client_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (its size already bounded by ``BodyLimit``)."""
    raw = await request.body()
    if len(raw) >= LARGE_BODY_BYTES:  # a 16 MiB body parses for ~0.3 s: not on the loop
        return await asyncio.to_thread(parse_body, raw)
    return parse_body(raw)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        detail = f": {exc}" if isinstance(exc, ValueError) else ": nested too deeply"
        raise bad_request(f"the request body is not valid JSON{detail}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _auth(request: Request) -> str | None:
    return request.headers.get("authorization")


async def _models(
    client: httpx.AsyncClient, router: Router, options: ProxyOptions, headers: dict[str, str]
) -> dict[str, Any]:
    """Every decode engine's models, once each."""
    seen: dict[str, Any] = {}
    for url in router.decode:
        try:
            got = client.get(url + "/v1/models", headers=headers)
            r = await asyncio.wait_for(got, options.timeouts.health_seconds)
            for m in r.json().get("data", []):
                seen.setdefault(m["id"], m)
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError, AttributeError):
            router.count_failure(url, prefill=False)
    return {"object": "list", "data": list(seen.values())}
