"""Response bodies in OpenAI's shapes, for /v1/completions and /v1/chat/completions.

One ``BaseFormat`` per endpoint says how a choice looks (whole or as a streamed delta) and how
log-probabilities look; the functions below build whole responses, chunks and usage from the
``RequestOutput`` of each prompt. Prompt ``i``'s choice ``j`` has index ``i * n + j`` (OpenAI's
order for a list of prompts with ``n`` choices each).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.server.logprob_format import (
    TokenLogprobs,
    chat_logprobs,
    collect,
    completion_logprobs,
)
from hybridkv.server.params import Answer, Prepared


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    id: str
    created: int
    model: str

    def fields(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


class BaseFormat(ABC):
    id_prefix: str
    object_full: str
    object_chunk: str
    prompt_param: str  # the request field a prompt error names

    @abstractmethod
    def full_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        """A choice of a whole (non-streamed) response."""

    @abstractmethod
    def chunk_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        """A choice of one streamed chunk: ``text`` is the new text only."""


class CompletionFormat(BaseFormat):
    id_prefix, object_full, object_chunk = "cmpl", "text_completion", "text_completion"
    prompt_param = "prompt"

    def full_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "text": text,
            "logprobs": completion_logprobs(lp),
            "finish_reason": reason,
        }

    def chunk_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        return self.full_choice(index, text, lp, reason)


class ChatFormat(BaseFormat):
    id_prefix, object_full, object_chunk = "chatcmpl", "chat.completion", "chat.completion.chunk"
    prompt_param = "messages"

    def full_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(lp),
            "finish_reason": reason,
        }

    def chunk_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        return {
            "index": index,
            "delta": delta,
            "logprobs": chat_logprobs(lp),
            "finish_reason": reason,
        }


def finish_reason(out: RequestOutput, completion: CompletionOutput) -> str | None:
    """OpenAI's reasons are ``stop`` and ``length``; ``abort`` and ``error`` pass through."""
    return completion.finish_reason if out.finished else None


def usage(outs: Sequence[RequestOutput]) -> dict[str, Any]:
    num_prompt = sum(o.num_prompt_tokens for o in outs)
    num_completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outs)},
    }


def kept_outputs(out: RequestOutput, n: int) -> list[CompletionOutput]:
    """The ``n`` choices shown: all of them, or (``best_of > n``) the ``n`` with the highest
    cumulative log-probability."""
    outputs = sorted(out.outputs, key=lambda c: c.index)
    if len(outputs) <= n:
        return outputs
    return sorted(outputs, key=lambda c: -_cumulative(c))[:n]


def _cumulative(c: CompletionOutput) -> float:
    value = getattr(c, "cumulative_logprob", None)
    return float("-inf") if value is None else float(value)


def output_logprobs(
    c: CompletionOutput,
    start: int,
    end: int,
    text_offset: int,
    answer: Answer,
    tokenizer: Detokenizer,
) -> TokenLogprobs | None:
    """The log-probabilities of output tokens [start, end), if the request asked for them."""
    entries: Any = c.logprobs
    if answer.top_logprobs is None or entries is None:
        return None
    return collect(c.token_ids[start:end], entries[start:end], answer.top_logprobs,
                   _decoder(tokenizer), text_offset)  # fmt: skip


def prompt_logprobs(
    out: RequestOutput, answer: Answer, tokenizer: Detokenizer
) -> TokenLogprobs | None:
    """The prompt's log-probabilities (echo with logprobs): None for the first token."""
    if answer.top_logprobs is None:
        return None
    entries = getattr(out, "prompt_logprobs", None) or [None] * len(out.prompt_token_ids)
    return collect(out.prompt_token_ids, entries, answer.top_logprobs, _decoder(tokenizer), 0)


def join_logprobs(a: TokenLogprobs | None, b: TokenLogprobs | None) -> TokenLogprobs | None:
    if a is None or b is None:
        return a or b
    return TokenLogprobs(a.tokens + b.tokens, a.logprobs + b.logprobs, a.top + b.top,
                         a.chosen + b.chosen, a.text_offset)  # fmt: skip


def full_response(
    fmt: BaseFormat,
    header: ResponseHeader,
    outs: Sequence[RequestOutput],
    prepared: Prepared,
    tokenizer: Detokenizer,
) -> dict[str, Any]:
    choices, answer = [], prepared.answer
    for i, out in enumerate(outs):
        prefix = echo_prefix(prepared, i)
        head = prompt_logprobs(out, answer, tokenizer) if answer.echo else None
        for j, c in enumerate(kept_outputs(out, answer.n)):
            lp = output_logprobs(c, 0, len(c.token_ids), len(prefix), answer, tokenizer)
            lp = join_logprobs(head, lp)
            reason = finish_reason(out, c)
            choices.append(fmt.full_choice(i * answer.n + j, prefix + c.text, lp, reason))
    body = {**header.fields(fmt.object_full), "choices": choices, "usage": usage(outs)}
    if len(outs) == 1:
        body["kv_transfer_params"] = outs[0].kv_transfer_params
    return body


def echo_prefix(prepared: Prepared, i: int) -> str:
    """The text before prompt ``i``'s choices: the prompt itself with ``echo``, else nothing."""
    return (prepared.requests[i].prompt or "") if prepared.answer.echo else ""


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


def usage_chunk(
    fmt: BaseFormat, header: ResponseHeader, outs: Sequence[RequestOutput]
) -> dict[str, Any]:
    return {**header.fields(fmt.object_chunk), "choices": [], "usage": usage(outs)}


def _decoder(tokenizer: Detokenizer) -> Any:
    return lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)
