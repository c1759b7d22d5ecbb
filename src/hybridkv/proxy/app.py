"""The proxy's routes. Per request: the prefill engine computes the prompt (``max_tokens=1``,
``kv_transfer_params={"do_remote_decode": true}``); its answer's ``kv_transfer_params`` go with
the original request to a decode engine, whose answer (streamed or not) passes through
unchanged. A prefill engine that fails is retried on the next; when all fail, the decode engine
serves the request colocated (no params)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hybridkv.proxy.metrics import render_metrics
from hybridkv.proxy.router import Outcome, Router

log = logging.getLogger(__name__)

GENERATE_TIMEOUT = httpx.Timeout(600.0, connect=5.0)


def create_proxy_app(router: Router) -> FastAPI:
    client = httpx.AsyncClient(timeout=GENERATE_TIMEOUT)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="hybridkv proxy", lifespan=lifespan)

    async def generate(path: str, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        params = await _prefill(client, router, path, body)
        if params is not None:
            body = {**body, "kv_transfer_params": params}
        return await _decode(client, router, path, body, params is not None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate("/v1/chat/completions", request)

    @app.get("/health")
    async def health() -> Response:
        for url in router.decode:
            try:
                if (await client.get(url + "/health", timeout=5.0)).status_code == 200:
                    return JSONResponse({"status": "ok"})
            except httpx.HTTPError:
                continue
        return JSONResponse({"status": "no decode engine is healthy"}, status_code=503)

    @app.get("/v1/models")
    async def models() -> Response:
        seen: dict[str, dict[str, Any]] = {}
        for url in router.decode:
            try:
                r = await client.get(url + "/v1/models", timeout=5.0)
                for m in r.json().get("data", []):
                    seen.setdefault(m["id"], m)
            except (httpx.HTTPError, ValueError, KeyError):
                router.count_failure(url, prefill=False)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(router), media_type="text/plain; version=0.0.4")

    return app


async def _prefill(
    client: httpx.AsyncClient, router: Router, path: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The prefill engine's kv_transfer_params, or None if no prefill engine could do it."""
    prefill_body = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    prefill_body.pop("stream_options", None)
    if "max_completion_tokens" in prefill_body:
        prefill_body["max_completion_tokens"] = 1
    for url in router.prefill_order():
        try:
            r = await client.post(url + path, json=prefill_body)
            if r.status_code == 200:
                params = r.json().get("kv_transfer_params")
                if isinstance(params, dict):
                    return params
            if 400 <= r.status_code < 500:
                return None  # the request itself is bad: the decode engine answers the error
            log.warning("prefill engine %s answered %d", url, r.status_code)
        except httpx.HTTPError as exc:
            log.warning("prefill engine %s failed: %s", url, exc)
        router.count_failure(url, prefill=True)
    return None


async def _decode(
    client: httpx.AsyncClient, router: Router, path: str, body: dict[str, Any], disagg: bool
) -> Response:
    for url in router.decode_order():
        try:
            request = client.build_request("POST", url + path, json=body)
            upstream = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("decode engine %s failed: %s", url, exc)
            router.count_failure(url, prefill=False)
            continue
        router.count(Outcome.DISAGGREGATED if disagg else Outcome.COLOCATED)
        headers = {"content-type": upstream.headers.get("content-type", "application/json")}
        return StreamingResponse(
            _passthrough(upstream), status_code=upstream.status_code, headers=headers
        )
    router.count(Outcome.FAILED)
    return JSONResponse(
        {"error": {"message": "no decode engine answered", "type": "service_unavailable"}},
        status_code=503,
    )


async def _passthrough(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
