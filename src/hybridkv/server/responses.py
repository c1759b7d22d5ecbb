"""Response bodies in OpenAI's shapes, for /v1/completions and /v1/chat/completions.

One ``BaseFormat`` per endpoint says how a choice looks (whole or as a streamed delta) and how
log-probabilities look; the functions below build whole responses, chunks and usage from a
``RequestOutput``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

from hybridkv.engine.output import RequestOutput


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    id: str
    created: int
    model: str

    def fields(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Chosen tokens [start, end) of one output: their text and log-probabilities."""

    tokens: list[str]
    logprobs: list[float]
    text_offset: int  # characters of output text before the first of them


class BaseFormat(ABC):
    id_prefix: str
    object_full: str
    object_chunk: str
    prompt_param: str  # the request field a prompt error names

    @abstractmethod
    def full_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        """A choice of a whole (non-streamed) response."""

    @abstractmethod
    def chunk_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        """A choice of one streamed chunk: ``text`` is the new text only."""


class CompletionFormat(BaseFormat):
    id_prefix, object_full, object_chunk = "cmpl", "text_completion", "text_completion"
    prompt_param = "prompt"

    def full_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": 0,
            "text": text,
            "logprobs": _completion_logprobs(lp),
            "finish_reason": reason,
        }

    def chunk_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        return self.full_choice(text, lp, reason)


class ChatFormat(BaseFormat):
    id_prefix, object_full, object_chunk = "chatcmpl", "chat.completion", "chat.completion.chunk"
    prompt_param = "messages"

    def full_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {
            "index": 0,
            "message": message,
            "logprobs": _chat_logprobs(lp),
            "finish_reason": reason,
        }

    def chunk_choice(
        self, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": _chat_logprobs(lp), "finish_reason": reason}


def finish_reason(out: RequestOutput) -> str | None:
    """OpenAI's reasons are ``stop`` and ``length``; ``abort`` and ``error`` pass through."""
    return out.finish_reason if out.finished else None


def usage(out: RequestOutput) -> dict[str, Any]:
    num_completion = len(out.token_ids)
    return {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": num_completion,
        "total_tokens": out.num_prompt_tokens + num_completion,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


def token_logprobs(
    out: RequestOutput, start: int, end: int, text_offset: int, tokenizer: Detokenizer
) -> TokenLogprobs | None:
    values = out.outputs[0].logprobs
    if values is None:
        return None
    ids = out.token_ids[start:end]
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    chosen = [values[i][t].logprob for i, t in enumerate(ids, start)]
    return TokenLogprobs(tokens, chosen, text_offset)


def full_response(
    fmt: BaseFormat, header: ResponseHeader, out: RequestOutput, tokenizer: Detokenizer
) -> dict[str, Any]:
    lp = token_logprobs(out, 0, len(out.token_ids), 0, tokenizer)
    choice = fmt.full_choice(out.text, lp, finish_reason(out))
    return {
        **header.fields(fmt.object_full),
        "choices": [choice],
        "usage": usage(out),
        "kv_transfer_params": out.kv_transfer_params,
    }


def chunk(
    fmt: BaseFormat,
    header: ResponseHeader,
    choice: dict[str, Any],
    kv_transfer_params: dict[str, object] | None = None,
) -> dict[str, Any]:
    """One streamed chunk; the last one carries the connector's ``kv_transfer_params``."""
    body = {**header.fields(fmt.object_chunk), "choices": [choice]}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return body


def usage_chunk(fmt: BaseFormat, header: ResponseHeader, out: RequestOutput) -> dict[str, Any]:
    return {**header.fields(fmt.object_chunk), "choices": [], "usage": usage(out)}


def _completion_logprobs(lp: TokenLogprobs | None) -> dict[str, Any] | None:
    if lp is None:
        return None
    offsets, at = [], lp.text_offset
    for token in lp.tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": lp.tokens,
        "token_logprobs": lp.logprobs,
        "top_logprobs": [{t: v} for t, v in zip(lp.tokens, lp.logprobs, strict=True)],
        "text_offset": offsets,
    }


def _chat_logprobs(lp: TokenLogprobs | None) -> dict[str, Any] | None:
    if lp is None:
        return None
    content = [
        {"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
        for t, v in zip(lp.tokens, lp.logprobs, strict=True)
    ]
    return {"content": content}
