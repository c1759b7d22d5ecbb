"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` + a status.

| status | type                  | when                                                        |
|--------|-----------------------|-------------------------------------------------------------|
| 400    | invalid_request_error | malformed JSON; a body that breaks the schema (missing     |
|        |                       | field, wrong type); a value the engine cannot serve         |
| 401    | authentication_error  | missing or wrong ``Authorization: Bearer <key>``            |
| 404    | invalid_request_error | unknown model (code ``model_not_found``) or route           |
| 408    | invalid_request_error | the body took longer than ``body_timeout_seconds`` to send  |
| 413    | invalid_request_error | the body is larger than ``--max-request-bytes``             |
| 500    | server_error          | the engine failed this request; a bug in the server         |
| 503    | service_unavailable   | the engine is not running or stalled; the queue is full     |
|        |                       | (``Retry-After`` then says when to try again)               |
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

INVALID_REQUEST = "invalid_request_error"
logger = logging.getLogger("hybridkv.server")


class APIError(Exception):
    """An error a handler returns to the client as-is."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected_error)


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    log_refusal(request, exc)
    return exc.response()


def log_refusal(request: Request, exc: APIError) -> None:
    """Every refused request says why in the log (the client got the same message)."""
    where = f"{request.method} {request.url.path}"
    param = f" [{exc.param}]" if exc.param else ""
    logger.info("refused %s: %d %s%s: %s", where, exc.status, exc.type, param, exc.message)


async def _on_http_error(_: Request, exc: HTTPException) -> JSONResponse:
    type_ = "not_found_error" if exc.status_code == 404 else INVALID_REQUEST
    return APIError(exc.status_code, str(exc.detail), type=type_).response()


async def _on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    message = f"internal error: {type(exc).__name__}: {exc}"
    return APIError(500, message, type="server_error", code="internal_error").response()


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    error = validation_error(exc.errors())
    log_refusal(request, error)
    return error.response()


def validation_error(errors: Any) -> APIError:
    """400 for a body that is not JSON, or naming the first field that breaks the schema
    (OpenAI answers 400 there too; FastAPI's default would be 422)."""
    first = dict(errors[0]) if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON: {detail}".rstrip(": "))
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid request body"))
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return APIError(400, message, param=param, code=first.get("type"))
