"""vLLM's routes beyond the OpenAI core: ``GET /version``, and a clear refusal in OpenAI's
error shape for each API hybridkv does not serve (embeddings, the Responses API, scoring,
pooling, audio), naming what it does serve instead of a bare 404. (``/ping`` is ``/health``'s
twin, in ``app.py``.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from hybridkv import __version__
from hybridkv.server.errors import APIError

VERSION_PATH = "/version"
SERVED = (
    "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize, "
    "POST /detokenize, POST /reset_prefix_cache, GET /health, GET /metrics"
)
_POOLING = "pooling and scoring models (hybridkv serves generative models)"
# route -> what it is, for the refusal's message
UNSERVED = {
    "/v1/embeddings": "embeddings (hybridkv serves generative models)",
    "/v1/responses": "the Responses API (use /v1/chat/completions)",
    "/v1/responses/{response_id:path}": "the Responses API (use /v1/chat/completions)",
    "/v1/score": _POOLING,
    "/score": _POOLING,
    "/v1/rerank": _POOLING,
    "/rerank": _POOLING,
    "/v2/rerank": _POOLING,
    "/pooling": _POOLING,
    "/classify": _POOLING,
    "/v1/audio/transcriptions": "audio models",
    "/v1/audio/translations": "audio models",
}


def add_compat_routes(app: FastAPI) -> None:
    app.add_api_route(VERSION_PATH, _version, methods=["GET"])
    for path, what in UNSERVED.items():
        app.add_api_route(path, _refusal(path, what), methods=["GET", "POST", "DELETE"])


async def _version() -> JSONResponse:
    """vLLM's ``{"version": ...}``, with hybridkv's version."""
    return JSONResponse({"version": __version__, "engine": "hybridkv"})


def _refusal(path: str, what: str) -> Callable[[], Awaitable[JSONResponse]]:
    shown = path.split("/{")[0]

    async def refuse() -> JSONResponse:
        message = f"{shown} is not supported: hybridkv does not serve {what}; it serves {SERVED}"
        raise APIError(404, message, code="unsupported_endpoint")

    return refuse
