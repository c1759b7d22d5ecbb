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
from hybridkv.server.chat_output import ChatOutputPlan, ChoiceStream
from hybridkv.server.logprob_format import (
    TokenLogprobs,
    chat_logprobs,
    collect,
    completion_logprobs,
    vllm_logprobs,
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
    prompt_fields_on_choice = True  # prompt_token_ids / prompt_logprobs per choice (else top)

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
    """Chat choices: the text becomes a message through the request's ``ChatOutputPlan``
    (reasoning and tool calls split off); one ``ChoiceStream`` per streamed choice."""

    id_prefix, object_full, object_chunk = "chatcmpl", "chat.completion", "chat.completion.chunk"
    prompt_param = "messages"
    prompt_fields_on_choice = False

    def __init__(self, plan: ChatOutputPlan | None = None) -> None:
        self.plan = plan or ChatOutputPlan()
        self._streams: dict[int, ChoiceStream] = {}

    def full_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None
    ) -> dict[str, Any]:
        message, called = self.plan.message(text)
        return {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(lp),
            "finish_reason": self.plan.finish_reason(reason, called),
        }

    def chunk_choice(
        self, index: int, text: str, lp: TokenLogprobs | None, reason: str | None, first: bool
    ) -> dict[str, Any]:
        stream = self._streams.setdefault(index, self.plan.stream())
        delta = stream.delta(text, final=reason is not None)
        if first:
            delta = {"role": "assistant", "content": delta.pop("content", ""), **delta}
        return {
            "index": index,
            "delta": delta,
            "logprobs": chat_logprobs(lp),
            "finish_reason": self.plan.finish_reason(reason, stream.called),
        }


def finish_reason(out: RequestOutput, completion: CompletionOutput) -> str | None:
    """OpenAI's reasons are ``stop`` and ``length``; ``abort`` and ``error`` pass through."""
    return completion.finish_reason if out.finished else None


def usage(outs: Sequence[RequestOutput], answer: Answer | None = None) -> dict[str, Any]:
    """Token counts; ``echo`` with ``max_tokens=0`` shows (and counts) no completion token."""
    num_prompt = sum(o.num_prompt_tokens for o in outs)
    echo_only = answer is not None and answer.echo_only
    num_completion = 0 if echo_only else sum(len(c.token_ids) for o in outs for c in o.outputs)
    out: dict[str, Any] = {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outs)},
    }
    seqs = [o.kv_events_seq for o in outs if o.kv_events_seq is not None]
    if seqs:  # hybridkv's extension (KV events on): the events that cover this answer
        out["kv_events_seq"] = max(seqs)
    return out


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
        prompt = prompt_fields(answer, out, tokenizer)
        for j, c in enumerate(kept_outputs(out, answer.n)):
            num_shown = 0 if answer.echo_only else len(c.token_ids)
            lp = output_logprobs(c, 0, num_shown, len(prefix), answer, tokenizer)
            lp = join_logprobs(head, lp)
            reason = finish_reason(out, c)
            text = prefix + (c.text if num_shown else "")
            choice = fmt.full_choice(i * answer.n + j, text, lp, reason)
            if answer.return_token_ids:
                choice["token_ids"] = list(c.token_ids[:num_shown])
            choices.append({**choice, **prompt} if fmt.prompt_fields_on_choice else choice)
    body = {**header.fields(fmt.object_full), "choices": choices, "usage": usage(outs, answer)}
    if not fmt.prompt_fields_on_choice and outs:
        body.update(prompt_fields(answer, outs[0], tokenizer))
    if len(outs) == 1:
        body["kv_transfer_params"] = outs[0].kv_transfer_params
    return body


def prompt_fields(answer: Answer, out: RequestOutput, tokenizer: Detokenizer) -> dict[str, Any]:
    """vLLM's prompt extensions, as asked: ``prompt_token_ids`` and ``prompt_logprobs`` (one
    entry per prompt token, None first: ``{token_id: {logprob, rank, decoded_token}}``)."""
    fields: dict[str, Any] = {}
    if answer.return_token_ids:
        fields["prompt_token_ids"] = list(out.prompt_token_ids)
    if answer.prompt_logprobs:
        entries = getattr(out, "prompt_logprobs", None) or [None] * len(out.prompt_token_ids)
        fields["prompt_logprobs"] = [vllm_logprobs(e, _decoder(tokenizer)) for e in entries]
    return fields


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
    fmt: BaseFormat, header: ResponseHeader, outs: Sequence[RequestOutput], answer: Answer
) -> dict[str, Any]:
    return {**header.fields(fmt.object_chunk), "choices": [], "usage": usage(outs, answer)}


def _decoder(tokenizer: Detokenizer) -> Any:
    return lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)
