"""From a validated request body to what the engine takes: prompt token ids + SamplingParams.

Everything here raises ``APIError`` (400) naming the parameter at fault; value checks are
``SamplingParams``'s own, so the server and ``LLM.generate`` accept the same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2

from hybridkv.sampling_params import SamplingParams
from hybridkv.server.errors import bad_request
from hybridkv.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class PromptTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready for the engine, plus how to answer it."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


def prepare_completion(
    body: CompletionRequest, tokenizer: PromptTokenizer, max_model_len: int
) -> PreparedRequest:
    _refuse_unsupported(body)
    _refuse(body.echo, "echo", "echo=true (prompt log-probabilities) is not supported")
    _refuse((body.best_of or 1) > 1, "best_of", "best_of > 1 is not supported")
    _refuse(body.suffix is not None, "suffix", "suffix (insertion) is not supported")
    _refuse(
        (body.logprobs or 0) > 0,
        "logprobs",
        "only logprobs=0 (the chosen tokens' log-probabilities) is supported",
    )
    if isinstance(body.prompt, str):
        text, ids = body.prompt, tokenizer.encode(body.prompt)
    else:
        text, ids = None, list(body.prompt)
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    params = build_sampling_params(body, max_tokens, logprobs=body.logprobs is not None)
    return _prepared(body, text, ids, params)


def prepare_chat(
    body: ChatCompletionRequest, tokenizer: PromptTokenizer, max_model_len: int
) -> PreparedRequest:
    _refuse_unsupported(body)
    _refuse(
        (body.top_logprobs or 0) > 0,
        "top_logprobs",
        "top_logprobs > 0 is not supported: logprobs=true gives the chosen tokens' log-probabilities",
    )
    messages = [m.as_template_input() for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, body.add_generation_prompt)
    except (ValueError, jinja2.TemplateError) as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
    ids = tokenizer.encode(text)
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    if max_tokens is None:  # OpenAI's chat default: whatever room the context leaves
        max_tokens = max(max_model_len - len(ids), 1)
    params = build_sampling_params(body, max_tokens, logprobs=body.logprobs)
    return _prepared(body, text, ids, params)


def build_sampling_params(body: _SamplingFields, max_tokens: int, logprobs: bool) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            seed=body.seed,
            stop=tuple(body.stop or ()),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            logprobs=logprobs,
            extra_args=(
                {"kv_transfer_params": body.kv_transfer_params}
                if body.kv_transfer_params is not None
                else None
            ),
        )
    except ValueError as exc:
        raise bad_request(str(exc), _param_of(str(exc))) from None


def _prepared(
    body: _SamplingFields, text: str | None, ids: list[int], params: SamplingParams
) -> PreparedRequest:
    options = body.stream_options
    if options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    return PreparedRequest(
        prompt=text,
        prompt_token_ids=ids,
        params=params,
        stream=body.stream,
        include_usage=bool(options and options.include_usage),
    )


def _refuse_unsupported(body: _SamplingFields) -> None:
    _refuse(body.n != 1, "n", f"n={body.n} is not supported: only n=1 (one choice per request)")
    for name in ("presence_penalty", "frequency_penalty"):
        _refuse(getattr(body, name) != 0.0, name, f"{name} is not supported (must be 0)")
    _refuse(bool(body.logit_bias), "logit_bias", "logit_bias is not supported")


def _refuse(cond: bool, param: str, message: str) -> None:
    if cond:
        raise bad_request(message, param)


def _param_of(message: str) -> str | None:
    """The parameter a SamplingParams error names ('invalid sampling parameter top_p=...')."""
    match = re.search(r"parameter (\w+)=", message)
    return match.group(1) if match else None
