"""From a validated request body to what the engine takes: prompt token ids + SamplingParams.

Everything here raises ``APIError`` (400) naming the parameter at fault; value checks are
``SamplingParams``'s own, so the server and ``LLM.generate`` accept the same values. A field
the request leaves unset takes the model's default (``generation_config.json``, see
``hybridkv.model.generation_config``), else SamplingParams's. The functions here tokenize, so
routes run them off the event loop (``Tokenizer.encode`` releases the GIL); a text longer than
any prompt of ``max_model_len`` tokens can be is refused before it is tokenized
(``PromptLimits.max_prompt_chars``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hybridkv.chat_boundaries import message_boundaries, with_cache_boundaries
from hybridkv.sampling.params import SamplingParams
from hybridkv.server.chat_output import (
    ChatOutputPlan,
    ChatParsers,
    constrained_params,
    plan_chat_output,
)
from hybridkv.server.errors import bad_request
from hybridkv.server.limits import PromptLimits
from hybridkv.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from hybridkv.server.sampling import build_sampling_params, refuse

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class PromptTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One engine request (one prompt; the engine makes ``params.n`` choices of it)."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """How to answer: streamed or not, and which choices and log-probabilities to show."""

    stream: bool
    include_usage: bool
    n: int = 1  # choices per prompt shown (best_of > n: the engine makes more, we keep n)
    echo: bool = False  # completions: the prompt (and its logprobs) before each choice
    top_logprobs: int | None = None  # alternatives per token shown; None: no logprobs
    echo_only: bool = False  # echo with max_tokens=0: the prompt alone (one token is made)
    prompt_logprobs: bool = False  # show the prompt's logprobs in vLLM's shape
    return_token_ids: bool = False  # show prompt_token_ids and token_ids (vLLM's)
    chat: ChatOutputPlan = ChatOutputPlan()  # chat: reasoning and tool calls parsed


@dataclass(frozen=True, slots=True)
class Prepared:
    requests: list[PreparedRequest]
    answer: Answer


def prepare_completion(
    body: CompletionRequest,
    tokenizer: PromptTokenizer,
    limits: PromptLimits,
    defaults: dict[str, Any] | None = None,
) -> Prepared:
    defaults = defaults or {}
    refuse(body.suffix is not None, "suffix", "suffix (insertion) is not supported")
    logprobs = body.logprobs
    refuse(logprobs is not None and logprobs < 0, "logprobs", "logprobs must be >= 0")
    n = 1 if body.n is None else body.n
    best_of = n if body.best_of is None else body.best_of
    refuse(best_of < n, "best_of", f"best_of={best_of} must be >= n={n}")
    refuse(best_of > n and body.stream, "best_of", "best_of > n cannot be streamed")
    echo_only = body.echo and body.max_tokens == 0  # vLLM's scoring mode (lm-eval's)
    requests = []
    for i, prompt in enumerate(body.prompt):
        param = "prompt" if len(body.prompt) == 1 else f"prompt.{i}"
        if isinstance(prompt, str):
            special = body.add_special_tokens
            text, ids = prompt, encode_prompt(tokenizer, prompt, limits, param, special)
        else:
            text, ids = None, list(prompt)
        ids = truncate(ids, body.truncate_prompt_tokens, limits)
        max_tokens = default_max_tokens(body.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS, defaults)
        max_tokens = 1 if echo_only else max_tokens
        check_context(len(ids), max_tokens, limits.max_model_len, param)
        # best_of > n ranks the candidates by cumulative logprob: the engine must compute it
        ranked = logprobs if logprobs is not None or best_of == n else 0
        params = build_sampling_params(
            body, defaults, max_tokens, logprobs=ranked, n=best_of, limits=limits, echo=body.echo
        )
        if body.echo and text is None:
            text = decode_prompt(tokenizer, ids, param)
        requests.append(PreparedRequest(text, ids, params, _cache_salt(body)))
    answer = Answer(*_stream_flags(body), n=n, echo=body.echo, top_logprobs=logprobs,
                    echo_only=echo_only, **_shown(body))  # fmt: skip
    return Prepared(requests, answer)


def prepare_chat(
    body: ChatCompletionRequest,
    tokenizer: PromptTokenizer,
    limits: PromptLimits,
    defaults: dict[str, Any] | None = None,
    parsers: ChatParsers | None = None,
) -> Prepared:
    defaults = defaults or {}
    top = body.top_logprobs
    refuse(top is not None and top < 0, "top_logprobs", "top_logprobs must be >= 0")
    refuse(
        top is not None and top > 0 and not body.logprobs,
        "top_logprobs",
        "top_logprobs needs logprobs=true",
    )
    text = render_chat(body, tokenizer)
    plan = plan_chat_output(body, parsers or ChatParsers(), text)
    ids = encode_prompt(tokenizer, text, limits, "messages", body.add_special_tokens)
    ids = truncate(ids, body.truncate_prompt_tokens, limits)
    asked = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    # OpenAI's chat default: whatever room the context leaves
    max_tokens = default_max_tokens(asked, max(limits.max_model_len - len(ids), 1), defaults)
    check_context(len(ids), max_tokens, limits.max_model_len, "messages")
    logprobs = (top or 0) if body.logprobs else None
    n = 1 if body.n is None else body.n
    params = build_sampling_params(body, defaults, max_tokens, logprobs=logprobs, n=n,
                                   limits=limits)  # fmt: skip
    params = constrained_params(params, plan, body)
    params = with_cache_boundaries(params, chat_boundaries(body, tokenizer, ids))
    request = PreparedRequest(text, ids, params, _cache_salt(body))
    answer = Answer(*_stream_flags(body), n=n, top_logprobs=logprobs, chat=plan, **_shown(body))
    return Prepared([request], answer)


def render_chat(body: ChatCompletionRequest, tokenizer: PromptTokenizer) -> str:
    """The prompt text: the model's template over the messages, tools and template kwargs."""
    refuse(
        body.chat_template is not None,
        "chat_template",
        "a per-request chat_template is not accepted (as vLLM without "
        "--trust-request-chat-template): start the server with --chat-template",
    )
    refuse(
        body.continue_final_message and body.add_generation_prompt,
        "continue_final_message",
        "continue_final_message=true needs add_generation_prompt=false",
    )
    kwargs = dict(body.chat_template_kwargs or {})
    clash = sorted(set(kwargs) & {"messages", "add_generation_prompt", "tools", "documents"})
    refuse(bool(clash), "chat_template_kwargs", f"chat_template_kwargs may not set {clash}")
    try:
        text = tokenizer.apply_chat_template(
            [m.as_template_input() for m in body.messages],
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            tools=body.tool_dicts(),
            documents=body.documents,
            **kwargs,
        )
    except ValueError as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None
    return str(text)


def chat_boundaries(
    body: ChatCompletionRequest, tokenizer: PromptTokenizer, ids: list[int]
) -> list[int]:
    """Where each message ends in the prompt ``ids``, rendered and encoded as ``render_chat``
    and ``encode_prompt`` did (state checkpoint boundaries for later conversations)."""
    template = {
        "tools": body.tool_dicts(),
        "documents": body.documents,
        **(body.chat_template_kwargs or {}),
    }
    messages = [m.as_template_input() for m in body.messages]
    return message_boundaries(tokenizer, messages, ids, body.add_special_tokens, **template)


def default_max_tokens(asked: int | None, fallback: int, defaults: dict[str, Any]) -> int:
    """The request's max_tokens, else ``fallback``; never above the model's
    ``max_new_tokens`` (generation_config.json: a server-wide limit, as in vLLM)."""
    value = fallback if asked is None else asked
    limit = defaults.get("max_tokens")
    return min(value, limit) if isinstance(limit, int) and limit >= 1 else value


def truncate(ids: list[int], keep: int | None, limits: PromptLimits) -> list[int]:
    """vLLM's ``truncate_prompt_tokens``: keep the last ``keep`` tokens (-1: max_model_len)."""
    if keep is None:
        return ids
    if keep == -1:
        keep = limits.max_model_len
    refuse(keep < 1, "truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or >= 1")
    return ids[-keep:]


def encode_prompt(
    tokenizer: PromptTokenizer,
    text: str,
    limits: PromptLimits,
    param: str,
    add_special_tokens: bool = True,
) -> list[int]:
    """Token ids of a valid Unicode text no longer than a prompt can be (400 otherwise)."""
    check_unicode(text, param)
    if limits.max_prompt_chars is not None and len(text) > limits.max_prompt_chars:
        raise bad_request(
            f"the prompt has {len(text)} characters: more than {limits.max_prompt_chars}, "
            f"so more than max_model_len={limits.max_model_len} tokens",
            param,
        )
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def decode_prompt(tokenizer: PromptTokenizer, ids: list[int], param: str) -> str:
    """The text of a token-id prompt (echo); an id no tokenizer has (negative, beyond 32
    bits) is a 400 here, before the engine's own vocabulary check."""
    try:
        return tokenizer.decode(ids, skip_special_tokens=False)
    except (OverflowError, ValueError, TypeError) as exc:
        raise bad_request(
            f"{param} has a token id the tokenizer cannot read: {exc}", param
        ) from None


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


def _shown(body: _SamplingFields) -> dict[str, Any]:
    """What the response shows beyond OpenAI's fields (vLLM's extensions)."""
    asked = body.prompt_logprobs is not None
    refuse(
        asked and body.stream and body.prompt_logprobs != 0,
        "prompt_logprobs",
        "prompt_logprobs are not available when stream=true",
    )
    return {"prompt_logprobs": asked, "return_token_ids": bool(body.return_token_ids)}


def _stream_flags(body: _SamplingFields) -> tuple[bool, bool]:
    options = body.stream_options
    if options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    return body.stream, bool(options and options.include_usage)


def _cache_salt(body: _SamplingFields) -> str | None:
    if body.cache_salt is not None:
        refuse(not body.cache_salt, "cache_salt", "cache_salt must be a non-empty string")
        check_unicode(body.cache_salt, "cache_salt")
    return body.cache_salt
