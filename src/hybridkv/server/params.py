"""From a validated request body to what the engine takes: prompt token ids + SamplingParams.

Everything here raises ``APIError`` (400) naming the parameter at fault; value checks are
``SamplingParams``'s own, so the server and ``LLM.generate`` accept the same values. The
functions here tokenize, so routes run them off the event loop (``Tokenizer.encode`` releases
the GIL); a text longer than any prompt of ``max_model_len`` tokens can be is refused before
it is tokenized (``PromptLimits.max_prompt_chars``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2

from hybridkv.chat_boundaries import message_boundaries, with_cache_boundaries
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
class PromptLimits:
    """How long a prompt may be: ``max_model_len`` tokens, so at most ``max_prompt_chars``
    characters (``max_model_len`` times the longest token's text; None: no early check)."""

    max_model_len: int
    max_prompt_chars: int | None = None


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready for the engine, plus how to answer it."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    cache_salt: str | None = None


def prepare_completion(
    body: CompletionRequest, tokenizer: PromptTokenizer, limits: PromptLimits
) -> PreparedRequest:
    _refuse_unsupported(body)
    _refuse(body.echo, "echo", "echo=true (prompt log-probabilities) is not supported")
    _refuse((body.best_of or 1) > 1, "best_of", "best_of > 1 is not supported")
    _refuse(body.suffix is not None, "suffix", "suffix (insertion) is not supported")
    _refuse((body.logprobs or 0) < 0, "logprobs", "logprobs must be >= 0")
    _refuse(
        (body.logprobs or 0) > 0,
        "logprobs",
        "only logprobs=0 (the chosen tokens' log-probabilities) is supported",
    )
    if isinstance(body.prompt, str):
        text, ids = body.prompt, encode_prompt(tokenizer, body.prompt, limits, "prompt")
    else:
        text, ids = None, list(body.prompt)
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    check_context(len(ids), max_tokens, limits.max_model_len, "prompt")
    params = build_sampling_params(body, max_tokens, logprobs=body.logprobs is not None)
    return _prepared(body, text, ids, params)


def prepare_chat(
    body: ChatCompletionRequest, tokenizer: PromptTokenizer, limits: PromptLimits
) -> PreparedRequest:
    _refuse_unsupported(body)
    _refuse((body.top_logprobs or 0) < 0, "top_logprobs", "top_logprobs must be >= 0")
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
    ids = encode_prompt(tokenizer, text, limits, "messages")
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    if max_tokens is None:  # OpenAI's chat default: whatever room the context leaves
        max_tokens = max(limits.max_model_len - len(ids), 1)
    check_context(len(ids), max_tokens, limits.max_model_len, "messages")
    params = build_sampling_params(body, max_tokens, logprobs=body.logprobs)
    params = with_cache_boundaries(params, message_boundaries(tokenizer, messages, ids))
    return _prepared(body, text, ids, params)


def encode_prompt(
    tokenizer: PromptTokenizer, text: str, limits: PromptLimits, param: str
) -> list[int]:
    """Token ids of a valid Unicode text no longer than a prompt can be (400 otherwise)."""
    check_unicode(text, param)
    if limits.max_prompt_chars is not None and len(text) > limits.max_prompt_chars:
        raise bad_request(
            f"the prompt has {len(text)} characters: more than {limits.max_prompt_chars}, "
            f"so more than max_model_len={limits.max_model_len} tokens",
            param,
        )
    return tokenizer.encode(text)


def check_unicode(text: str, param: str) -> None:
    """A lone surrogate (JSON ``"\\ud800"``) is not text: no tokenizer can encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(
            f"{param} is not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} "
            f"at character {exc.start}",
            param,
        ) from None


def check_context(num_prompt_tokens: int, max_tokens: int, max_model_len: int, param: str) -> None:
    """vLLM's rule: the prompt and every token asked for must fit the context (400 if not)."""
    if num_prompt_tokens >= max_model_len:
        raise bad_request(
            f"the prompt has {num_prompt_tokens} tokens: it does not fit max_model_len="
            f"{max_model_len} (room is needed for at least one output token)",
            param,
        )
    if num_prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"this model's maximum context length is {max_model_len} tokens (max_model_len), "
            f"but {num_prompt_tokens + max_tokens} were requested ({num_prompt_tokens} in the "
            f"prompt, {max_tokens} in the completion): lower max_tokens",
            "max_tokens",
        )


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
            extra_args=_extra_args(body),
        )
    except ValueError as exc:
        raise bad_request(str(exc), _param_of(str(exc))) from None


def _extra_args(body: _SamplingFields) -> dict[str, object] | None:
    extra: dict[str, object] = {}
    if body.kv_transfer_params is not None:
        extra["kv_transfer_params"] = body.kv_transfer_params
    if body.cache_boundaries is not None:
        extra["cache_boundaries"] = body.cache_boundaries
    return extra or None


def _prepared(
    body: _SamplingFields, text: str | None, ids: list[int], params: SamplingParams
) -> PreparedRequest:
    options = body.stream_options
    if options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    if body.cache_salt is not None:
        _refuse(not body.cache_salt, "cache_salt", "cache_salt must be a non-empty string")
        check_unicode(body.cache_salt, "cache_salt")
    return PreparedRequest(
        prompt=text,
        prompt_token_ids=ids,
        params=params,
        stream=body.stream,
        include_usage=bool(options and options.include_usage),
        cache_salt=body.cache_salt,
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
