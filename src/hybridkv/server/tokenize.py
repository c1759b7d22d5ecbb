"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's routes, same bodies and answers).

``/tokenize`` takes a completion-style ``{"prompt": str}`` or a chat-style ``{"messages": [...]}``
body (rendered by the same code as ``/v1/chat/completions``, with the same template options)
and answers ``{"count", "max_model_len", "tokens", "token_strs"}``; ``token_strs`` is filled
when ``return_token_strs`` is true. ``/detokenize`` takes ``{"tokens": [...]}`` and answers
``{"prompt": text}``; an id outside the vocabulary is a 400 naming it. ``model`` is optional;
when given it must be the served model (404 otherwise). Both run off the event loop, parsing
included (the body is read on it, bounded by ``--max-request-bytes``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from hybridkv.server.errors import bad_request, validation_error
from hybridkv.server.params import encode_prompt, render_chat
from hybridkv.server.protocol import STRICT, ChatCompletionRequest
from hybridkv.server.state import ServerState

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
M = TypeVar("M", bound=BaseModel)


class TokenizeRequest(BaseModel):
    """A completion-style body; chat-style bodies are checked as a chat request's."""

    model_config = STRICT

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    tokens: list[int]


async def tokenize(request: Request) -> JSONResponse:
    state = ServerState.of(request)
    return await asyncio.to_thread(_tokenize, state, await request.body())


async def detokenize(request: Request) -> JSONResponse:
    state = ServerState.of(request)
    return await asyncio.to_thread(_detokenize, state, await request.body())


def _tokenize(state: ServerState, raw: bytes) -> JSONResponse:
    """The whole of /tokenize, on a worker thread."""
    body = _json_object(raw)
    if "messages" in body:
        ids = _tokenize_chat(state, body)
        want_strs = body.get("return_token_strs") is True
    else:
        req = _parse(TokenizeRequest, body)
        _check_model(state, req.model)
        limits = state.prompt_limits
        ids = encode_prompt(state.tokenizer, req.prompt, limits, "prompt", req.add_special_tokens)
        want_strs = req.return_token_strs
    strs = state.tokenizer.convert_ids_to_tokens(ids) if want_strs else None
    answer = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    return JSONResponse({**answer, "token_strs": strs})


def _detokenize(state: ServerState, raw: bytes) -> JSONResponse:
    """The whole of /detokenize, on a worker thread: a 16 MiB body is ~3.5M ids, a second of
    parsing, checking and decoding that must not hold the event loop."""
    req = _parse(DetokenizeRequest, _json_object(raw))
    _check_model(state, req.model)
    vocab = int(state.tokenizer.vocab_size)
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token ids {bad[:8]} are outside the vocabulary [0, {vocab})", "tokens")
    return JSONResponse({"prompt": state.tokenizer.decode(req.tokens, False)})


def _tokenize_chat(state: ServerState, body: dict[str, Any]) -> list[int]:
    """The prompt ids ``/v1/chat/completions`` would compute for these messages."""
    chat = _parse(ChatCompletionRequest, {**body, "model": body.get("model") or state.model_name})
    state.check_model(chat.model)
    text = render_chat(chat, state.tokenizer)
    return encode_prompt(
        state.tokenizer, text, state.prompt_limits, "messages", chat.add_special_tokens
    )


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise bad_request("the body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", None)
    return body


def _parse(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None:
        state.check_model(name)
